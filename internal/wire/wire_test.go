package wire

import (
	"net/http"
	"testing"
	"time"
)

func TestParsePriority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"critical", 0, true},
		{"HIGH", 1, true},
		{"Normal", 2, true},
		{"low", 3, true},
		{"test", 4, true},
		{"", 0, false},
		{" low", 0, false}, // the caller trims
		{"urgent", 0, false},
		{"1", 0, false},
	} {
		if got, ok := ParsePriority(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("ParsePriority(%q) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestAllDigits(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"0", true},
		{"0123456789", true},
		{"", false},
		{"+1", false},
		{"-1", false},
		{" 1", false},
		{"1.5", false},
		{"١٢٣", false}, // Arabic-Indic digits are not ASCII digits
	} {
		if got := AllDigits(tc.in); got != tc.want {
			t.Errorf("AllDigits(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestTrimOWS(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"a", "a"},
		{" \ta b\t ", "a b"},
		{"\t\t", ""},
		{"\na\n", "\na\n"}, // only space and tab are OWS
	} {
		if got := TrimOWS(tc.in); got != tc.want {
			t.Errorf("TrimOWS(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestHeaderAbove(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		n    int64
		want bool
	}{
		{nil, 0, false},
		{[]string{"2"}, 1, true},
		{[]string{"1"}, 1, false},
		{[]string{" 3\t"}, 1, true},
		{[]string{"2", "3"}, 1, false}, // two values contradict each other
		{[]string{"-5"}, -10, false},
		{[]string{"x"}, 0, false},
		{[]string{"999999999999999999"}, 0, true},   // 18 digits
		{[]string{"9999999999999999999"}, 0, false}, // 19: refused before converting
	} {
		h := http.Header{}
		if tc.vals != nil {
			h["K"] = tc.vals
		}
		if got := HeaderAbove(h, "K", tc.n); got != tc.want {
			t.Errorf("HeaderAbove(%q, %d) = %v, want %v", tc.vals, tc.n, got, tc.want)
		}
	}
}

func TestParseMillis(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1500", 1500 * time.Millisecond, true},
		{" 42 ", 42 * time.Millisecond, true},
		{"0", 0, false},
		{"-1", 0, false},
		{"+5", 0, false},
		{"1e3", 0, false},
		{"", 0, false},
		{"99999999999999999999", time.Duration(maxHeaderMillis) * time.Millisecond, true}, // capped, not refused
	} {
		if got, ok := ParseMillis(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("ParseMillis(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseGRPCTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"2S", 2 * time.Second, true},
		{"250m", 250 * time.Millisecond, true},
		{"3M", 3 * time.Minute, true},
		{"1H", time.Hour, true},
		{"7u", 7 * time.Microsecond, true},
		{"9n", 9, true},
		{"99999999H", time.Duration(1<<63 - 1), true}, // capped, not overflowed
		{"0n", 0, false},
		{"5s", 0, false}, // units are case-sensitive
		{"S", 0, false},
		{"123456789S", 0, false}, // 9 digits
		{"-1S", 0, false},
		{"", 0, false},
	} {
		if got, ok := ParseGRPCTimeout(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("ParseGRPCTimeout(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzParse: no input makes a parser panic or report a deadline that is
// not positive.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1500", "0", "-1", "+5", "1e3", " 42 ", "99999999999999999999", "2S", "250m", "99999999H", "0n", "5s", "1", "", "١٢٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if d, ok := ParseMillis(v); ok && d <= 0 {
			t.Fatalf("ParseMillis(%q) = %v, true; want a positive duration", v, d)
		}
		if d, ok := ParseGRPCTimeout(v); ok && d <= 0 {
			t.Fatalf("ParseGRPCTimeout(%q) = %v, true; want a positive duration", v, d)
		}
		if s := TrimOWS(v); len(s) > len(v) {
			t.Fatalf("TrimOWS(%q) = %q, longer than its input", v, s)
		}
		if i, ok := ParsePriority(v); ok && (i < 0 || i >= len(PriorityNames)) {
			t.Fatalf("ParsePriority(%q) = %d, true; out of range", v, i)
		}
	})
}
