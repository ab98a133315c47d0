// Package jsonkeys checks the object keys of a JSON text against the Go type it decodes
// into. encoding/json matches a key to a struct field case-insensitively. It keeps the last
// of a key given twice. So {"orderId":"o-2","orderid":"o-3"} decodes as o-3, and
// {"ORDERID":"o-1"} as o-1. Check refuses both. It refuses a key that names a field only in
// another case, and a key given twice in one object.
package jsonkeys

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// ErrFieldCase is wrapped by Check's error for a key that is a field's name in another case.
var ErrFieldCase = errors.New("field name in another case")

// ErrDuplicateKey is wrapped by Check's error for a key given twice in one object.
var ErrDuplicateKey = errors.New("key given twice")

// ErrSyntax is wrapped by Check's error for data that is not JSON text. Callers decode with
// encoding/json first, which names the error better.
var ErrSyntax = errors.New("not JSON text")

// Unmarshal is json.Unmarshal followed by Check against v's type.
func Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return err
	}
	return Check(data, reflect.TypeOf(v))
}

// Check returns an error for the first key of data that encoding/json would resolve
// silently when it decodes data into a value of type t.
//
//   - A key that is not exactly the name of a field of the struct its object decodes into,
//     but equals one case-insensitively, gives an error wrapping ErrFieldCase. The case
//     folds as encoding/json folds it, by bytes.EqualFold.
//   - A key given twice in an object that decodes into a struct, a map or an interface
//     value gives an error wrapping ErrDuplicateKey.
//
// The error names the key and its byte offset. Check does not look into values that
// encoding/json does not read, such as unknown fields. Nor does it look into values of a
// type that decodes itself, such as json.Unmarshaler, encoding.TextUnmarshaler and
// json.RawMessage. Only the first JSON value of data is checked.
func Check(data []byte, t reflect.Type) error {
	s := scanner{b: data}
	_, err := s.value(planOf(t), s.space(0))
	return err
}

// kind is how a plan checks a JSON value.
type kind uint8

const (
	skip      kind = iota // not looked into
	anyValue              // an interface value, with every object's keys unique at every depth
	structure             // a struct, with keys exact and unique and fields by their plans
	mapping               // a map, with keys unique and values by elem
	list                  // a slice or array, with elements by elem
)

// plan is how to check the JSON value that decodes into one Go type.
type plan struct {
	kind   kind
	elem   *plan            // the elements' plan of a mapping or list
	fields map[string]*plan // a structure's field names that encoding/json decodes, with each field's plan
	names  [][]byte         // structure: the same names, for the case-insensitive match
}

var (
	skipPlan = &plan{kind: skip}
	anyPlan  = &plan{kind: anyValue}
)

func init() { anyPlan.elem = anyPlan }

var (
	plansMu sync.Mutex
	plans   sync.Map // reflect.Type → *plan
)

// planOf returns t's plan, built once per type.
func planOf(t reflect.Type) *plan {
	if t == nil {
		return anyPlan
	}
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	plansMu.Lock()
	defer plansMu.Unlock()
	building := map[reflect.Type]*plan{}
	p := build(t, building)
	for t, p := range building {
		plans.LoadOrStore(t, p)
	}
	return p
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// build makes t's plan. building holds the plans being built, so a recursive type refers to
// its own plan.
func build(t reflect.Type, building map[reflect.Type]*plan) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	if p, ok := building[t]; ok {
		return p
	}
	if t.Implements(jsonUnmarshaler) || t.Implements(textUnmarshaler) || t.Kind() != reflect.Pointer &&
		(reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)) {
		return skipPlan
	}
	switch t.Kind() {
	case reflect.Pointer:
		p := build(t.Elem(), building)
		building[t] = p
		return p
	case reflect.Interface:
		return anyPlan
	case reflect.Map, reflect.Slice, reflect.Array, reflect.Struct:
	default:
		return skipPlan
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
		return skipPlan // []byte is a base64 string
	}
	p := &plan{}
	building[t] = p
	switch t.Kind() {
	case reflect.Map:
		p.kind, p.elem = mapping, build(t.Elem(), building)
	case reflect.Slice, reflect.Array:
		p.kind, p.elem = list, build(t.Elem(), building)
	default:
		p.kind, p.fields = structure, map[string]*plan{}
		for _, f := range fieldsOf(t) {
			p.fields[f.name] = build(f.typ, building)
			p.names = append(p.names, []byte(f.name))
		}
	}
	return p
}

type field struct {
	name string
	typ  reflect.Type
}

// fieldsOf lists the fields encoding/json decodes into a struct of type t, by the name it
// matches. That name is the json tag's name, else the Go name. An embedded struct without a
// tag name gives its own fields. Of fields with one name, the least deep is kept.
func fieldsOf(t reflect.Type) []field {
	var out []field
	seen := map[string]bool{}
	visited := map[reflect.Type]bool{}
	for level := []reflect.Type{t}; len(level) > 0; {
		var next []reflect.Type
		named := map[string]bool{}
		for _, st := range level {
			if visited[st] {
				continue
			}
			visited[st] = true
			for i := range st.NumField() {
				sf := st.Field(i)
				ft := sf.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if sf.Anonymous {
					if !sf.IsExported() && ft.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				if !validTagName(name) {
					name = ""
				}
				if name == "" && sf.Anonymous && ft.Kind() == reflect.Struct {
					next = append(next, ft)
					continue
				}
				if name == "" {
					name = sf.Name
				}
				if !seen[name] {
					named[name] = true
					out = append(out, field{name, sf.Type})
				}
			}
		}
		for n := range named {
			seen[n] = true
		}
		level = next
	}
	return out
}

// validTagName reports whether encoding/json takes s as a field's name, as its isValidTag
// does.
func validTagName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}

// scanner walks one JSON text.
type scanner struct{ b []byte }

func (s *scanner) space(i int) int {
	for i < len(s.b) && (s.b[i] == ' ' || s.b[i] == '\t' || s.b[i] == '\n' || s.b[i] == '\r') {
		i++
	}
	return i
}

func (s *scanner) syntax(i int) error { return fmt.Errorf("%w at byte %d", ErrSyntax, i) }

// value checks the value at b[i] against p and returns the index after it.
func (s *scanner) value(p *plan, i int) (int, error) {
	if i >= len(s.b) {
		return 0, s.syntax(i)
	}
	switch s.b[i] {
	case '{':
		if p.kind == skip || p.kind == list {
			return s.skip(i)
		}
		return s.object(p, i)
	case '[':
		if p.kind != list && p.kind != anyValue {
			return s.skip(i)
		}
		return s.array(p.elem, i)
	}
	return s.skip(i)
}

// object checks the object at b[i] against p, a structure, mapping or anyValue plan.
func (s *scanner) object(p *plan, i int) (int, error) {
	var small [16][]byte
	seen := small[:0]
	var many map[string]bool
	i = s.space(i + 1)
	if i < len(s.b) && s.b[i] == '}' {
		return i + 1, nil
	}
	for {
		at := i
		key, next, err := s.key(i)
		if err != nil {
			return 0, err
		}
		if many == nil {
			for _, k := range seen {
				if bytes.Equal(k, key) {
					return 0, fmt.Errorf("%w: %s at byte %d", ErrDuplicateKey, quote(key), at)
				}
			}
			if seen = append(seen, key); len(seen) > len(small) {
				many = make(map[string]bool, 2*len(seen))
				for _, k := range seen {
					many[string(k)] = true
				}
			}
		} else {
			if many[string(key)] {
				return 0, fmt.Errorf("%w: %s at byte %d", ErrDuplicateKey, quote(key), at)
			}
			many[string(key)] = true
		}
		elem := p.elem
		if p.kind == structure {
			var ok bool
			if elem, ok = p.fields[string(key)]; !ok {
				elem = skipPlan
				for _, name := range p.names {
					if bytes.EqualFold(name, key) {
						return 0, fmt.Errorf("%w: %s at byte %d is field %q", ErrFieldCase, quote(key), at, name)
					}
				}
			}
		}
		i = s.space(next)
		if i >= len(s.b) || s.b[i] != ':' {
			return 0, s.syntax(i)
		}
		if i, err = s.value(elem, s.space(i+1)); err != nil {
			return 0, err
		}
		i = s.space(i)
		if i >= len(s.b) {
			return 0, s.syntax(i)
		}
		switch s.b[i] {
		case '}':
			return i + 1, nil
		case ',':
			i = s.space(i + 1)
		default:
			return 0, s.syntax(i)
		}
	}
}

// array checks the elements of the array at b[i] against elem.
func (s *scanner) array(elem *plan, i int) (int, error) {
	i = s.space(i + 1)
	if i < len(s.b) && s.b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = s.value(elem, i); err != nil {
			return 0, err
		}
		i = s.space(i)
		if i >= len(s.b) {
			return 0, s.syntax(i)
		}
		switch s.b[i] {
		case ']':
			return i + 1, nil
		case ',':
			i = s.space(i + 1)
		default:
			return 0, s.syntax(i)
		}
	}
}

// key returns the decoded key at b[i] and the index after it. A key without a backslash is
// its bytes, without a copy.
func (s *scanner) key(i int) ([]byte, int, error) {
	if i >= len(s.b) || s.b[i] != '"' {
		return nil, 0, s.syntax(i)
	}
	end, escaped, err := s.str(i)
	if err != nil {
		return nil, 0, err
	}
	if !escaped {
		return s.b[i+1 : end-1], end, nil
	}
	var k string
	if err := json.Unmarshal(s.b[i:end], &k); err != nil {
		return nil, 0, s.syntax(i)
	}
	return []byte(k), end, nil
}

// str returns the index after the string at b[i] and whether it has a backslash.
func (s *scanner) str(i int) (end int, escaped bool, err error) {
	for j := i + 1; j < len(s.b); j++ {
		switch s.b[j] {
		case '"':
			return j + 1, escaped, nil
		case '\\':
			escaped = true
			j++
		}
	}
	return 0, false, s.syntax(i)
}

// skip returns the index after the value at b[i], not looking into it.
func (s *scanner) skip(i int) (int, error) {
	if i >= len(s.b) {
		return 0, s.syntax(i)
	}
	switch s.b[i] {
	case '"':
		end, _, err := s.str(i)
		return end, err
	case '{', '[':
		depth := 0
		for j := i; j < len(s.b); j++ {
			switch s.b[j] {
			case '"':
				end, _, err := s.str(j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, s.syntax(i)
	}
	j := i // a number or a literal: up to the next delimiter
	for j < len(s.b) && !delimiter(s.b[j]) {
		j++
	}
	if j == i {
		return 0, s.syntax(i)
	}
	return j, nil
}

// delimiter reports whether c ends a number or a literal.
func delimiter(c byte) bool {
	switch c {
	case ',', ':', '{', '}', '[', ']', '"', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// maxQuoted is the most of a key an error quotes, because the key is the sender's.
const maxQuoted = 64

// quote is key quoted. A longer key is cut to its first maxQuoted bytes and "...".
func quote(key []byte) string {
	if len(key) <= maxQuoted {
		return strconv.Quote(string(key))
	}
	n := maxQuoted
	for n > 0 && !utf8.RuneStart(key[n]) {
		n--
	}
	return strconv.Quote(string(key[:n])) + "..."
}
