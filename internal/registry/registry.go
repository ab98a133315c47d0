// Package registry is a small, typed, compile-time plugin registry, in the style of
// database/sql drivers and Caddy modules. Plugin packages register from init. Only the
// binary and tests import plugin packages. Duplicate or empty names are programming errors
// and panic at start-up with a clear message.
package registry

import (
	"fmt"
	"sort"
	"sync"
)

// Registry holds named values of type T.
type Registry[T any] struct {
	kind  string
	mu    sync.RWMutex
	items map[string]T
}

// New returns an empty registry. kind names what it holds in error messages, such as
// "plugin".
func New[T any](kind string) *Registry[T] {
	return &Registry[T]{kind: kind, items: map[string]T{}}
}

// Register adds v under name. It fails for an empty or already registered name.
func (r *Registry[T]) Register(name string, v T) error {
	if name == "" {
		return fmt.Errorf("%s registry: empty name", r.kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.items[name]; dup {
		return fmt.Errorf("%s registry: %q registered twice (two packages, or one imported under two paths, claim the same name)", r.kind, name)
	}
	r.items[name] = v
	return nil
}

// MustRegister is Register that panics, for init functions.
func (r *Registry[T]) MustRegister(name string, v T) {
	if err := r.Register(name, v); err != nil {
		panic(err)
	}
}

// Get returns the value registered under name.
func (r *Registry[T]) Get(name string) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.items[name]
	return v, ok
}

// Names returns the registered names, sorted.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.items))
	for n := range r.items {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
