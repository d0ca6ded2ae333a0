package grammar

import (
	"encoding/json"
	"math"
	"math/bits"
	"slices"
	"strconv"
)

// object compiles an object node: declared properties in any order, each
// at most once, required ones before '}', additional ones only when
// additionalProperties allows them.
func (c *compiler) object(m map[string]any, path string, depth int) (uint16, error) {
	n := node{kind: kObject, addl: -1}
	props, _ := m["properties"].(map[string]any)
	if _, ok := m["properties"]; ok && props == nil {
		return 0, &SchemaError{Path: path, Keyword: "properties", Reason: "an object is expected", Err: ErrInvalidSchema}
	}
	if len(props) > MaxProperties {
		return 0, &SchemaError{Path: path, Keyword: "properties", Reason: "more than " + strconv.Itoa(MaxProperties), Err: ErrTooLarge}
	}
	n.keys = newTrie()
	for i, name := range slices.Sorted(mapKeys(props)) {
		if !validName(name) {
			return 0, &SchemaError{Path: path, Keyword: "properties", Reason: "name " + strconv.Quote(name) + " needs escaping in JSON", Err: ErrUnsupported}
		}
		id, err := c.compile(props[name], path+"/properties/"+pointerEscape(name), depth+1)
		if err != nil {
			return 0, err
		}
		if err := c.spend(len(name), path, "properties"); err != nil {
			return 0, err
		}
		n.names = append(n.names, name)
		n.propNode = append(n.propNode, id)
		n.keys.insert([]byte(name), i)
	}
	if err := trieFits(n.keys, path, "properties"); err != nil {
		return 0, err
	}
	n.keys.finish()
	if err := c.required(&n, m, path); err != nil {
		return 0, err
	}
	switch a := m["additionalProperties"].(type) {
	case nil:
		if _, ok := m["additionalProperties"]; ok {
			return 0, &SchemaError{Path: path, Keyword: "additionalProperties", Reason: "a boolean or a schema is expected", Err: ErrInvalidSchema}
		}
	case bool:
		if a {
			id, err := c.anyValue()
			if err != nil {
				return 0, err
			}
			n.addl = int32(id)
		}
	case map[string]any:
		id, err := c.compile(a, path+"/additionalProperties", depth+1)
		if err != nil {
			return 0, err
		}
		n.addl = int32(id)
	default:
		return 0, &SchemaError{Path: path, Keyword: "additionalProperties", Reason: "a boolean or a schema is expected", Err: ErrInvalidSchema}
	}
	if err := c.propCounts(&n, m, path); err != nil {
		return 0, err
	}
	sortOptional(c.nodes, &n)
	n.minLen = 1 + dueCost(c.nodes, &n, 0)
	if due(&n, 0) == 0 {
		n.minLen = 2
	}
	return c.add(n)
}

// propCounts reads minProperties and maxProperties, refusing bounds no
// object of the node can meet and, with additional properties allowed, a
// minimum the declared properties cannot meet (props.go says why).
func (c *compiler) propCounts(n *node, m map[string]any, path string) error {
	var err error
	if n.minProps, err = count(m, path, "minProperties", 0, MaxProperties); err != nil {
		return err
	}
	if n.maxProps, err = count(m, path, "maxProperties", unbounded, math.MaxInt); err != nil {
		return err
	}
	n.maxProps = min(n.maxProps, unbounded)
	bad := func(kw, reason string, e error) error {
		return &SchemaError{Path: path, Keyword: kw, Reason: reason, Err: e}
	}
	switch {
	case n.minProps > len(n.names) && n.addl >= 0:
		return bad("minProperties", "above the declared properties: only declared ones count towards it", ErrUnsupported)
	case n.minProps > len(n.names):
		return bad("minProperties", "above the declared properties, and no additional ones are allowed", ErrInvalidSchema)
	case n.maxProps < n.minProps:
		return bad("maxProperties", "below minProperties", ErrInvalidSchema)
	case n.maxProps < bits.OnesCount64(n.required):
		return bad("maxProperties", "below the required properties", ErrInvalidSchema)
	}
	return nil
}

func (c *compiler) required(n *node, m map[string]any, path string) error {
	r, ok := m["required"]
	if !ok {
		return nil
	}
	l, ok := r.([]any)
	if !ok {
		return &SchemaError{Path: path, Keyword: "required", Reason: "a list of property names is expected", Err: ErrInvalidSchema}
	}
	for _, e := range l {
		s, _ := e.(string)
		i := slices.Index(n.names, s)
		if i < 0 {
			return &SchemaError{Path: path, Keyword: "required", Reason: "names no declared property: " + strconv.Quote(s), Err: ErrInvalidSchema}
		}
		n.required |= 1 << i
	}
	return nil
}

func (c *compiler) array(m map[string]any, path string, depth int) (uint16, error) {
	n := node{kind: kArray, maxItems: unbounded}
	var err error
	if it, ok := m["items"]; ok {
		n.items, err = c.compile(it, path+"/items", depth+1)
	} else {
		n.items, err = c.anyValue()
	}
	if err != nil {
		return 0, err
	}
	if n.minItems, err = count(m, path, "minItems", 0, MaxMinItems); err != nil {
		return 0, err
	}
	if n.maxItems, err = count(m, path, "maxItems", unbounded, math.MaxInt); err != nil {
		return 0, err
	}
	n.maxItems = min(n.maxItems, unbounded)
	if n.maxItems < n.minItems {
		return 0, &SchemaError{Path: path, Keyword: "maxItems", Reason: "below minItems", Err: ErrInvalidSchema}
	}
	n.minLen = 2
	if n.minItems > 0 {
		n.minLen = 1 + n.minItems*(c.nodes[n.items].minLen+1)
	}
	return c.add(n)
}

// count reads a non-negative integer keyword, def when absent.
func count(m map[string]any, path, kw string, def, limit int) (int, error) {
	v, ok := m[kw]
	if !ok {
		return def, nil
	}
	num, _ := v.(json.Number)
	i, err := strconv.ParseInt(num.String(), 10, 64)
	if err != nil || i < 0 {
		return 0, &SchemaError{Path: path, Keyword: kw, Reason: "a non-negative integer is expected", Err: ErrInvalidSchema}
	}
	if i > int64(limit) {
		return 0, &SchemaError{Path: path, Keyword: kw, Reason: "above " + strconv.Itoa(limit), Err: ErrTooLarge}
	}
	return int(i), nil
}

// anyValue returns the node of any JSON value, built once per schema: a
// union of any object, any array, any string, any number, true, false and
// null. Its containers nest only as deep as the automaton's stack allows.
func (c *compiler) anyValue() (uint16, error) {
	if c.any >= 0 {
		return uint16(c.any), nil
	}
	id, err := c.add(node{kind: kUnion, minLen: 1})
	if err != nil {
		return 0, err
	}
	c.any = int32(id)
	obj, err := c.add(node{kind: kObject, keys: finished(newTrie()), addl: int32(id), maxProps: unbounded, minLen: 2})
	if err != nil {
		return 0, err
	}
	arr, err := c.add(node{kind: kArray, items: id, maxItems: unbounded, minLen: 2})
	if err != nil {
		return 0, err
	}
	str, err := c.add(node{kind: kString, minLen: 2})
	if err != nil {
		return 0, err
	}
	num, err := c.add(node{kind: kNumber, minLen: 1})
	if err != nil {
		return 0, err
	}
	lit, err := c.literal([]string{"true", "false", "null"}, "", "")
	if err != nil {
		return 0, err
	}
	c.nodes[id].alts = []uint16{obj, arr, str, num, lit}
	return id, nil
}

func pointerEscape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '~':
			out = append(out, '~', '0')
		case '/':
			out = append(out, '~', '1')
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}
