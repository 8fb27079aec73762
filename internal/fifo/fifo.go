// Package fifo is the first-in first-out list that bulwark's queues are:
// the client bulkhead's waiters, and the server Shedder's, one list per
// rank.
package fifo

// List is a first-in first-out list linked through its elements, so that
// one leaving from the middle (its caller gave up waiting) costs O(1) and
// pushing allocates nothing. The zero List is empty. It does no locking:
// its owner's mutex guards it and the links of its elements. P is *T, with
// the method that finds an element's links.
type List[T any, P interface {
	*T
	FIFOLinks() *Links[T]
}] struct {
	head, tail *T // oldest, newest; nil when empty
	n          int
}

// Links are the two pointers an element of a List carries. An element
// holds its Links as a field and returns its address from FIFOLinks; the
// zero Links is an element in no list.
type Links[T any] struct{ prev, next *T }

// Front returns the oldest element, or nil when l is empty.
func (l *List[T, P]) Front() *T { return l.head }

// Back returns the newest element, or nil when l is empty.
func (l *List[T, P]) Back() *T { return l.tail }

// Len returns how many elements l holds.
func (l *List[T, P]) Len() int { return l.n }

// Push adds w, which must not be in a list, as the newest.
func (l *List[T, P]) Push(w *T) {
	lw := P(w).FIFOLinks()
	lw.prev, lw.next = l.tail, nil
	if l.tail != nil {
		P(l.tail).FIFOLinks().next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
}

// Remove takes w, which must be in l, out of it.
func (l *List[T, P]) Remove(w *T) {
	lw := P(w).FIFOLinks()
	if lw.prev != nil {
		P(lw.prev).FIFOLinks().next = lw.next
	} else {
		l.head = lw.next
	}
	if lw.next != nil {
		P(lw.next).FIFOLinks().prev = lw.prev
	} else {
		l.tail = lw.prev
	}
	lw.prev, lw.next = nil, nil
	l.n--
}
