package config

import (
	"log/slog"
	"net/http"
	"reflect"

	"github.com/bulwark-http/bulwark"
	"github.com/hashicorp/go-retryablehttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Registry holds the values a file cannot spell, functions and interfaces,
// by the names a file refers to them with: `classify: payments` in a file
// means Registry.Classifiers["payments"]. A name the registry does not hold
// is an error. Each map serves every field of its type, wherever it is: the
// Fallbacks map serves Fallback.Func of Default, of every upstream and of
// every route. The zero Registry holds nothing, and a file that names a
// function is then refused.
//
// Base, the providers, Propagator, Logger and Fleet are New's: Update
// ignores them (see bulwark.Transport.Update), so a reloaded file may name
// them but changing them takes a new Transport.
type Registry struct {
	Classifiers     map[string]bulwark.Classifier                                 // Policy.Classify
	Fallbacks       map[string]func(*http.Request, error) (*http.Response, error) // Fallback.Func
	CheckRetry      map[string]retryablehttp.CheckRetry                           // Retry.CheckRetry
	Backoffs        map[string]retryablehttp.Backoff                              // Retry.Backoff
	OnRetry         map[string]func(*http.Request, bulwark.RetryEvent)            // Retry.OnRetry
	PrepareRetry    map[string]func(*http.Request) error                          // Retry.PrepareRetry
	OnStateChange   map[string]func(host string, from, to bulwark.CircuitState)   // Breaker.OnStateChange
	ReadyToTrip     map[string]func(bulwark.BreakerCounts) bool                   // Breaker.ReadyToTrip
	Resolvers       map[string]bulwark.Resolver                                   // Endpoints.Resolver
	Bases           map[string]http.RoundTripper                                  // Config.Base
	TracerProviders map[string]trace.TracerProvider                               // Config.TracerProvider
	MeterProviders  map[string]metric.MeterProvider                               // Config.MeterProvider
	Propagators     map[string]propagation.TextMapPropagator                      // Config.Propagator
	Loggers         map[string]*slog.Logger                                       // Config.Logger
	Fleets          map[string]bulwark.Fleet                                      // Config.Fleet
}

// registryField is the name of Registry's map for values of type t, or ""
// when t is not a code-only type.
func registryField(t reflect.Type) string {
	rt := reflect.TypeFor[Registry]()
	for i := range rt.NumField() {
		if rt.Field(i).Type.Elem() == t {
			return rt.Field(i).Name
		}
	}
	return ""
}

// names is reg's map for values of type t; ok is false when Registry has
// none for t.
func (reg Registry) names(t reflect.Type) (m reflect.Value, ok bool) {
	f := registryField(t)
	if f == "" {
		return reflect.Value{}, false
	}
	return reflect.ValueOf(reg).FieldByName(f), true
}

// lookup is the value reg holds under name for type t.
func (reg Registry) lookup(t reflect.Type, name string) (reflect.Value, bool) {
	m, ok := reg.names(t)
	if !ok || m.IsNil() {
		return reflect.Value{}, false
	}
	v := m.MapIndex(reflect.ValueOf(name))
	return v, v.IsValid()
}

// nameOf is the name under which reg holds v, a value of a code-only type:
// funcs are matched by their code pointer, other values by identity. It
// fails when no name, or two names of values that cannot be told apart,
// match.
func (reg Registry) nameOf(v reflect.Value) (string, bool) {
	m, ok := reg.names(v.Type())
	if !ok || m.IsNil() {
		return "", false
	}
	found := ""
	n := 0
	iter := m.MapRange()
	for iter.Next() {
		if sameCode(iter.Value(), v) {
			if found == "" || iter.Key().String() < found {
				found = iter.Key().String()
			}
			n++
		}
	}
	// Two names for one value are fine (aliases): the first in order is
	// written. Funcs made by one literal share a code pointer and cannot
	// be told apart; writing either name would then be a guess.
	if n > 1 && v.Kind() == reflect.Func {
		return "", false
	}
	return found, n > 0
}

// sameCode reports whether a and b, of one code-only type, are the same
// value.
func sameCode(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Func, reflect.Pointer:
		return !a.IsNil() && a.Pointer() == b.Pointer()
	case reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return false
		}
		ae, be := a.Elem(), b.Elem()
		if ae.Type() != be.Type() {
			return false
		}
		if ae.Comparable() {
			return ae.Equal(be)
		}
		return false
	}
	return false
}
