package sdktest

import (
	"sort"
	"sync"
)

// syncSet is a set of strings safe for concurrent use.
type syncSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *syncSet) add(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]bool{}
	}
	s.m[k] = true
}

func (s *syncSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for k := range s.m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
