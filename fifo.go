package bulwark

// fifo is a first-in first-out list linked through its elements, so that
// one leaving from the middle (its caller gave up waiting) costs O(1) and
// pushing allocates nothing. The bulkhead's queue and the shedder's queues,
// one per priority, are fifos. The zero fifo is empty. It does no locking:
// its owner's mutex guards it and the links of its elements. P is *T, with
// the method that finds an element's links.
type fifo[T any, P interface {
	*T
	fifoLinks() *links[T]
}] struct {
	head, tail *T // oldest, newest; nil when empty
	n          int
}

// links are the two pointers an element of a fifo carries.
type links[T any] struct{ prev, next *T }

// push adds w, which must not be in a list, as the newest.
func (l *fifo[T, P]) push(w *T) {
	lw := P(w).fifoLinks()
	lw.prev, lw.next = l.tail, nil
	if l.tail != nil {
		P(l.tail).fifoLinks().next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
}

// remove takes w, which must be in l, out of it.
func (l *fifo[T, P]) remove(w *T) {
	lw := P(w).fifoLinks()
	if lw.prev != nil {
		P(lw.prev).fifoLinks().next = lw.next
	} else {
		l.head = lw.next
	}
	if lw.next != nil {
		P(lw.next).fifoLinks().prev = lw.prev
	} else {
		l.tail = lw.prev
	}
	lw.prev, lw.next = nil, nil
	l.n--
}
