package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// writeFile replaces dir/name with b, mode 0600, through a rename: a
// reader never sees half a file.
func writeFile(dir, name string, b []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", name, err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pki: write %s: %w", name, err)
	}
	return nil
}

func writePEM(dir, name string, ders ...[]byte) error {
	var b []byte
	for _, d := range ders {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
	}
	return writeFile(dir, name, b)
}

func writeKey(dir, name string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writeFile(dir, name, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoCerts, err)
	}
	return writeFile(filepath.Dir(to), filepath.Base(to), b)
}

// loadSigner reads a CA certificate and its key.
func loadSigner(certPath, keyPath string) (signer, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return signer{}, fmt.Errorf("%w: %v", ErrNoCerts, err)
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return signer{}, fmt.Errorf("%w: %v", ErrNoCerts, err)
	}
	cblock, _ := pem.Decode(cb)
	kblock, _ := pem.Decode(kb)
	if cblock == nil || kblock == nil {
		return signer{}, fmt.Errorf("%w: %s or %s is not PEM", ErrNoCerts, certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		return signer{}, fmt.Errorf("pki: %s: %w", certPath, err)
	}
	key, err := x509.ParseECPrivateKey(kblock.Bytes)
	if err != nil {
		return signer{}, fmt.Errorf("pki: %s: %w", keyPath, err)
	}
	return signer{cert, key}, nil
}
