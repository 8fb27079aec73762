package fifo

import (
	"slices"
	"testing"
)

type elem struct {
	id    int
	links Links[elem]
}

func (e *elem) FIFOLinks() *Links[elem] { return &e.links }

// ids lists l's elements oldest first, walking the links, and checks that
// the backward links and Len agree with the forward ones.
func ids(t *testing.T, l *List[elem, *elem]) []int {
	t.Helper()
	var got []int
	var prev *elem
	for e := l.Front(); e != nil; e = e.links.next {
		if e.links.prev != prev {
			t.Fatalf("element %d: prev link %p, want %p", e.id, e.links.prev, prev)
		}
		got = append(got, e.id)
		prev = e
	}
	if l.Back() != prev {
		t.Fatalf("Back() = %p, want the last element %p", l.Back(), prev)
	}
	if l.Len() != len(got) {
		t.Fatalf("Len() = %d, want %d", l.Len(), len(got))
	}
	return got
}

func TestList(t *testing.T) {
	var l List[elem, *elem]
	if l.Front() != nil || l.Back() != nil || l.Len() != 0 {
		t.Fatal("the zero List is not empty")
	}
	es := make([]*elem, 5)
	for i := range es {
		es[i] = &elem{id: i}
		l.Push(es[i])
	}
	steps := []struct {
		remove int
		want   []int
	}{
		{2, []int{0, 1, 3, 4}}, // the middle
		{0, []int{1, 3, 4}},    // the oldest
		{4, []int{1, 3}},       // the newest
		{1, []int{3}},
		{3, nil},
	}
	for _, st := range steps {
		l.Remove(es[st.remove])
		if got := ids(t, &l); !slices.Equal(got, st.want) {
			t.Fatalf("after Remove(%d): %v, want %v", st.remove, got, st.want)
		}
		if es[st.remove].links != (Links[elem]{}) {
			t.Fatalf("Remove(%d) left the element's links set", st.remove)
		}
	}
	// A removed element can be pushed again.
	l.Push(es[2])
	l.Push(es[0])
	if got := ids(t, &l); !slices.Equal(got, []int{2, 0}) {
		t.Fatalf("after pushing again: %v, want [2 0]", got)
	}
}

func BenchmarkPushRemove(b *testing.B) {
	b.ReportAllocs()
	var l List[elem, *elem]
	var e elem
	for b.Loop() {
		l.Push(&e)
		l.Remove(&e)
	}
}
