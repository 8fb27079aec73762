package config

import (
	"log/slog"
	"reflect"
	"strings"
	"time"
	"unicode"

	"github.com/bulwark-http/bulwark"
)

// The format is defined by one walk over the Go types, shared by the
// decoder, the encoder and the JSON Schema, so that a field added to
// bulwark.Policy is in the format, both ways, and in the schema, with no
// line written here:
//
//   - a struct is a mapping of its exported fields, each under its Go name
//     with the leading capital lowered (MaxAttempts → maxAttempts);
//   - a time.Duration is a Go duration string ("150ms");
//   - a bulwark.Jitter is its name ("full", "equal", "decorrelated", "none");
//   - a function, an interface or a *slog.Logger is a name in the Registry;
//   - a map is a mapping by its keys, a []byte a string, other slices
//     sequences, a pointer to a struct that struct or null.
//
// Config.Source is not in the format: the loader sets it (the file's path).

var (
	durationType = reflect.TypeFor[time.Duration]()
	jitterType   = reflect.TypeFor[bulwark.Jitter]()
	loggerType   = reflect.TypeFor[*slog.Logger]()
	bytesType    = reflect.TypeFor[[]byte]()
)

// kind is how the format spells a Go type.
type kind int

const (
	kindStruct kind = iota
	kindPointer
	kindMap
	kindSlice
	kindBytes
	kindDuration
	kindJitter
	kindCode
	kindString
	kindBool
	kindInt
	kindUint
	kindFloat
	kindUnsupported
)

func kindOf(t reflect.Type) kind {
	switch {
	case t == durationType:
		return kindDuration
	case t == jitterType:
		return kindJitter
	case t == loggerType, t.Kind() == reflect.Func, t.Kind() == reflect.Interface:
		return kindCode
	case t == bytesType:
		return kindBytes
	}
	switch t.Kind() {
	case reflect.Struct:
		return kindStruct
	case reflect.Pointer:
		if t.Elem().Kind() == reflect.Struct {
			return kindPointer
		}
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return kindMap
		}
	case reflect.Slice:
		return kindSlice
	case reflect.String:
		return kindString
	case reflect.Bool:
		return kindBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return kindInt
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return kindUint
	case reflect.Float32, reflect.Float64:
		return kindFloat
	}
	return kindUnsupported
}

// field is one field of a struct as the format has it.
type field struct {
	key   string // the format's name
	index int
	sf    reflect.StructField
}

// fieldsOf lists the format's fields of struct type t, in Go order.
func fieldsOf(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() || (t == configType && sf.Name == "Source") {
			continue
		}
		out = append(out, field{key: keyName(sf.Name), index: i, sf: sf})
	}
	return out
}

var configType = reflect.TypeFor[bulwark.Config]()

// keyName lowers the leading capital of a Go name, and the whole of a
// leading initialism but its last letter when a word follows:
// MaxAttempts → maxAttempts, K → k, KeyPOST → keyPOST, HTTPBase → httpBase.
func keyName(goName string) string {
	r := []rune(goName)
	n := 0
	for n < len(r) && unicode.IsUpper(r[n]) {
		n++
	}
	if n > 1 && n < len(r) {
		n-- // the last capital starts the next word
	}
	return strings.ToLower(string(r[:n])) + string(r[n:])
}

// jitterNames are the format's names of the bulwark.Jitter values: their
// String, lower-cased, for every value that has one.
var jitterNames = func() map[bulwark.Jitter]string {
	m := map[bulwark.Jitter]string{}
	for j := bulwark.Jitter(1); j != 0; j++ {
		if s := j.String(); !strings.HasPrefix(s, "Jitter(") {
			m[j] = strings.ToLower(s)
		}
	}
	return m
}()
