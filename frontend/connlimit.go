package frontend

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// capListener caps the open connections of a listener. A connection over
// the cap is refused where it is accepted, never queued: queued ones would
// hold the kernel's backlog and time out at the client instead of hearing
// "busy". Cleartext ones get a whole HTTP/1.1 503 with Retry-After (an
// HTTP/2 prior-knowledge client reads it as a broken preface, and retries
// the same way); TLS ones are closed, since nothing can be said before a
// handshake and a handshake is what the cap saves.
type capListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	// refuse answers a refused connection, on a goroutine of goes; nil
	// closes it.
	refuse  func(net.Conn)
	goes    *owned
	refused func() // counts a refusal
}

func newCapListener(ln net.Listener, goes *owned, max int, cleartext bool, refused func()) *capListener {
	l := &capListener{Listener: ln, goes: goes, max: int64(max), refused: refused}
	if cleartext {
		l.refuse = refuseBusy
	}
	return l
}

// Accept returns the next connection under the cap, refusing those over
// it on the way.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &cappedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refused()
		if l.refuse != nil {
			l.goes.Go(func() { l.refuse(c) }) // never stall the accept loop on a client
		} else {
			c.Close()
		}
	}
}

// Open is the number of connections accepted and not yet closed.
func (l *capListener) Open() int { return int(l.open.Load()) }

// cappedConn gives its place back once, on its first Close.
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// busyBody is the refusal's body: the OpenAI error shape.
const busyBody = `{"error":{"message":"the frontend is at its connection limit; retry shortly","type":"overloaded","param":null,"code":"too_many_connections"}}` + "\n"

// busyResponse is the whole refusal of a connection over the cap.
var busyResponse = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
	strconv.Itoa(len(busyBody)) + "\r\n\r\n" + busyBody

// refuseGrace bounds the time a refused connection is held: the write of
// the refusal and the wait for the client to read it.
const refuseGrace = time.Second

// refuseBusy writes the 503 and closes c. It half-closes first and reads
// what the client sent (briefly): closing a socket with unread input
// resets it, and a reset can destroy the refusal before the client reads
// it.
func refuseBusy(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(refuseGrace))
	if _, err := io.WriteString(c, busyResponse); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}
