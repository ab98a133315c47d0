// Package settings reads the configuration settings declared by struct tags. A field that
// is a setting carries its key, default, range and help beside it. The defaults, the range
// checks and the configuration table are generated from those tags.
//
//	MaxAttempts int `key:"max_attempts" default:"5" range:"1..1000" help:"handler attempts before …"`
//
// The tags are these.
//
//   - key is the setting's name in its section. A struct-typed field with a key is a
//     section, and its settings are named key.name. With ",squash" its settings join the
//     enclosing section instead. A map field is left to its owner, such as plugins.<name>.
//     A field without a key is not a setting.
//   - default is the value a zero field takes, in the configuration's syntax, such as 10s,
//     512 or a,b.
//   - range is min..max, inclusive, for numbers and durations.
//   - zero is the field's value for a configured 0. It serves fields whose own zero value
//     stands for their default. It is usually the library's "off" value, such as -1ns for
//     no linger.
//   - after names the key, in the same section, that this setting follows in the list. It
//     serves a section made of several structs, where a setting does not follow the field
//     before it. If that key is not listed, as in a library's struct on its own, the
//     setting stays in field order.
//   - help is the table's one line.
//
// A setting's field is a string, bool, int, int64, uint64, float64, time.Duration or
// []string.
package settings

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Setting is one key declared by a field's tags.
type Setting struct {
	Key  string // section.name from the walked struct
	Help string
	// Default is the default, of the field's type. It is the type's zero value when the
	// field has no default tag.
	Default any
	// HasRange reports a range tag. Min and Max are then of the field's type.
	HasRange bool
	Min, Max any
	// Zero is the field's value for a configured 0. When it is nil, a 0 is stored as 0.
	Zero any

	index []int
	typ   reflect.Type
	after string // the full key of the after tag, which this setting follows
}

var durationType = reflect.TypeOf(time.Duration(0))

var cache sync.Map // reflect.Type → []Setting

// List returns the settings of v, in field order. v is a struct or a pointer to one. List
// panics on a malformed tag or a key declared twice. Such a mistake is a programming error
// that every test meets.
func List(v any) []Setting {
	out, err := Parse(v)
	if err != nil {
		panic(err.Error())
	}
	return out
}

// Parse returns the settings of v as List does, and an error where List panics. It serves
// declarations that the program checks as it starts, such as a plugin's settings.
func Parse(v any) ([]Setting, error) {
	t := reflect.TypeOf(v)
	if t == nil {
		return nil, errors.New("settings: nil is no struct")
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s, ok := cache.Load(t); ok {
		return s.([]Setting), nil
	}
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("settings: %s is no struct", t)
	}
	var out []Setting
	if err := walk(t, "", nil, &out); err != nil {
		return nil, err
	}
	out = reorder(out)
	seen := map[string]bool{}
	for _, s := range out {
		if seen[s.Key] {
			return nil, fmt.Errorf("settings: %s: key %s declared twice", t, s.Key)
		}
		seen[s.Key] = true
	}
	cache.Store(t, out)
	return out, nil
}

func walk(t reflect.Type, prefix string, index []int, out *[]Setting) error {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("key")
		if !ok {
			continue
		}
		name, opt, _ := strings.Cut(tag, ",")
		idx := append(append([]int(nil), index...), i)
		switch {
		case opt == "squash":
			if f.Type.Kind() != reflect.Struct {
				return fmt.Errorf("settings: %s.%s: squash of a %s", t, f.Name, f.Type)
			}
			if err := walk(f.Type, prefix, idx, out); err != nil {
				return err
			}
		case f.Type.Kind() == reflect.Struct:
			if err := walk(f.Type, prefix+name+".", idx, out); err != nil {
				return err
			}
		case f.Type.Kind() == reflect.Map:
		default:
			s, err := parse(f, prefix+name, idx)
			if err != nil {
				return fmt.Errorf("settings: %s.%s: %w", t, f.Name, err)
			}
			*out = append(*out, s)
		}
	}
	return nil
}

// reorder moves each setting with an after tag behind the setting it names, in field order.
func reorder(in []Setting) []Setting {
	out := append([]Setting(nil), in...)
	for _, s := range in {
		if s.after == "" {
			continue
		}
		from := slices.IndexFunc(out, func(o Setting) bool { return o.Key == s.Key })
		out = slices.Delete(out, from, from+1)
		to := slices.IndexFunc(out, func(o Setting) bool { return o.Key == s.after }) + 1
		if to == 0 {
			to = from
		}
		out = slices.Insert(out, to, s)
	}
	return out
}

func parse(f reflect.StructField, key string, idx []int) (Setting, error) {
	s := Setting{Key: key, Help: f.Tag.Get("help"), index: idx, typ: f.Type}
	if a, ok := f.Tag.Lookup("after"); ok {
		s.after = key[:strings.LastIndex(key, ".")+1] + a
	}
	if !supported(f.Type) {
		return s, fmt.Errorf("type %s is not a setting's", f.Type)
	}
	s.Default = reflect.Zero(f.Type).Interface()
	if d, ok := f.Tag.Lookup("default"); ok {
		v, err := value(f.Type, d)
		if err != nil {
			return s, fmt.Errorf("default: %w", err)
		}
		s.Default = v
	}
	if r, ok := f.Tag.Lookup("range"); ok {
		if !numeric(f.Type) {
			return s, fmt.Errorf("range on a %s", f.Type)
		}
		lo, hi, ok := strings.Cut(r, "..")
		if !ok {
			return s, fmt.Errorf("range %q: want min..max", r)
		}
		var err error
		if s.Min, err = value(f.Type, lo); err != nil {
			return s, fmt.Errorf("range: %w", err)
		}
		if s.Max, err = value(f.Type, hi); err != nil {
			return s, fmt.Errorf("range: %w", err)
		}
		if compare(s.Min, s.Max) > 0 {
			return s, fmt.Errorf("range %q is empty", r)
		}
		s.HasRange = true
	}
	if z, ok := f.Tag.Lookup("zero"); ok {
		v, err := value(f.Type, z)
		if err != nil {
			return s, fmt.Errorf("zero: %w", err)
		}
		s.Zero = v
	}
	if s.HasRange && !s.IsZero(s.Default) && !s.within(s.Default) {
		return s, fmt.Errorf("default %v outside its range", s.Default)
	}
	return s, nil
}

func supported(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Uint64, reflect.Float64:
		return true
	case reflect.Slice:
		return t.Elem().Kind() == reflect.String
	}
	return false
}

func numeric(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint64, reflect.Float64:
		return true
	}
	return false
}

// value parses s, a value in the configuration's syntax, as a value of type t.
func value(t reflect.Type, s string) (any, error) {
	v := reflect.New(t).Elem()
	switch {
	case t == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, err
		}
		v.SetInt(int64(d))
	case t.Kind() == reflect.String:
		v.SetString(s)
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, err
		}
		v.SetBool(b)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, err
		}
		v.SetInt(n)
	case t.Kind() == reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, err
		}
		v.SetUint(n)
	case t.Kind() == reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		v.SetFloat(x)
	case t.Kind() == reflect.Slice:
		v.Set(reflect.ValueOf(strings.Split(s, ",")))
	}
	return v.Interface(), nil
}

// compare orders two numbers of one setting's type. It returns -1, 0 or 1. A NaN compares
// unequal to everything and returns 2.
func compare(a, b any) int {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() == reflect.Float64 {
		x, y := va.Float(), vb.Float()
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		case x == y:
			return 0
		}
		return 2
	}
	if va.Kind() == reflect.Uint64 {
		x, y := va.Uint(), vb.Uint()
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	}
	x, y := va.Int(), vb.Int()
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func (s Setting) within(v any) bool {
	lo, hi := compare(s.Min, v), compare(v, s.Max)
	return (lo == -1 || lo == 0) && (hi == -1 || hi == 0)
}

// IsZero reports whether v is the field's value for a configured 0, given by its zero tag.
func (s Setting) IsZero(v any) bool {
	return s.Zero != nil && reflect.DeepEqual(v, s.Zero)
}

// Get returns the setting's field in v. v is the struct List was given, or a pointer to it.
func (s Setting) Get(v any) any { return s.field(reflect.ValueOf(v)).Interface() }

// Set sets the setting's field in ptr to x. ptr points to the struct List was given. x is
// a value of the field's type.
func (s Setting) Set(ptr any, x any) {
	s.field(reflect.ValueOf(ptr)).Set(reflect.ValueOf(x).Convert(s.typ))
}

// Type is the field's type.
func (s Setting) Type() reflect.Type { return s.typ }

func (s Setting) field(v reflect.Value) reflect.Value {
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	return v.FieldByIndex(s.index)
}

// SetDefaults sets every zero setting of ptr to its default. ptr points to a struct.
func SetDefaults(ptr any) {
	v := reflect.ValueOf(ptr)
	for _, s := range List(ptr) {
		if f := s.field(v); f.IsZero() {
			d := reflect.ValueOf(s.Default)
			if d.Kind() == reflect.Slice { // a copy, because the caller may change its own
				d = reflect.AppendSlice(reflect.MakeSlice(d.Type(), 0, d.Len()), d)
			}
			f.Set(d)
		}
	}
}

// Resolve stores a configured 0 as the value of the field's zero tag. It serves settings
// whose field reads 0 as its default. Call it on a configuration as decoded, before it
// reaches the libraries.
func Resolve(ptr any) {
	v := reflect.ValueOf(ptr)
	for _, s := range List(ptr) {
		if f := s.field(v); s.Zero != nil && f.IsZero() {
			f.Set(reflect.ValueOf(s.Zero))
		}
	}
}

// Check reports the first setting of v outside its range. Its one line names the key, the
// value and the range. The key starts at v's own level. It is max_attempts in an
// engine.Config and inbox.max_attempts in the router's configuration. A field holding the
// value of its zero tag is checked as a configured 0.
func Check(v any) error {
	for _, s := range List(v) {
		if !s.HasRange {
			continue
		}
		x := s.Get(v)
		if s.IsZero(x) {
			x = reflect.Zero(s.typ).Interface()
		}
		if !s.within(x) {
			return &OutsideError{Key: s.Key, Value: show(x), Range: show(s.Min) + ".." + show(s.Max)}
		}
	}
	return nil
}

// OutsideError is Check's error.
type OutsideError struct {
	Key, Value, Range string
}

func (e *OutsideError) Error() string { return e.Key + " " + e.Value + " outside " + e.Range }

// show is a value as a range check shows it. It prints durations as time.Duration does.
func show(v any) string {
	if d, ok := v.(time.Duration); ok {
		return d.String()
	}
	return fmt.Sprint(v)
}

// Text is v as the configuration table shows a default. Durations drop trailing zero
// units, as in 100ms, 1m and 720h. Lists are joined by commas. An empty string stays
// empty.
func Text(v any) string {
	switch x := v.(type) {
	case time.Duration:
		s := x.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case []string:
		return strings.Join(x, ",")
	}
	return fmt.Sprint(v)
}
