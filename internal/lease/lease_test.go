package lease

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const sec = int64(time.Second)

// TestPool: a timeline of grants and takes.
func TestPool(t *testing.T) {
	var p Pool
	steps := []struct {
		at          int64
		grant       int64 // > 0: Grant(grant, at+until) before the take
		until       int64
		ok, valid   bool
		tokensAfter int64
	}{
		{at: 1, ok: false, valid: false},                                     // never leased
		{at: 2, grant: 2, until: sec, ok: true, valid: true, tokensAfter: 1}, // granted 2
		{at: 3, ok: true, valid: true, tokensAfter: 0},
		{at: 4, ok: false, valid: true},                                              // spent: the quota's answer
		{at: 2 * sec, ok: false, valid: false},                                       // the lease ended
		{at: 2*sec + 1, grant: 1, until: sec, ok: true, valid: true, tokensAfter: 0}, // void tokens not carried over
	}
	for i, s := range steps {
		if s.grant > 0 {
			p.Grant(s.grant, s.at+s.until, s.at)
		}
		ok, valid := p.Take(s.at)
		if ok != s.ok || valid != s.valid || p.Tokens(s.at) != s.tokensAfter {
			t.Fatalf("step %d: Take(%d) = %v, %v, tokens %d; want %v, %v, %d", i, s.at, ok, valid, p.Tokens(s.at), s.ok, s.valid, s.tokensAfter)
		}
	}
	// A zero grant still says "spent until then".
	p.Grant(0, 5*sec, 3*sec)
	if ok, valid := p.Take(3 * sec); ok || !valid {
		t.Fatalf("after a zero grant: %v, %v; want spent", ok, valid)
	}
}

// TestPoolConcurrent: concurrent takes never spend more than granted.
func TestPoolConcurrent(t *testing.T) {
	var p Pool
	p.Grant(1000, 10*sec, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range 8 {
		wg.Go(func() {
			n := 0
			for range 500 {
				if ok, _ := p.Take(1); ok {
					n++
				}
			}
			mu.Lock()
			got += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if got != 1000 {
		t.Fatalf("%d tokens spent of 1000 granted by 4000 takes", got)
	}
}

// TestWant: the ask follows demand, less what is in hand, capped.
func TestWant(t *testing.T) {
	var p Pool
	ahead := 300 * time.Millisecond
	if w := p.Want(sec, ahead, 100); w != 0 {
		t.Fatalf("Want with no demand = %d, want 0", w)
	}
	// 50 takes in 100 ms, twice: 500 a second, 150 for 300 ms.
	now := sec
	for range 50 {
		p.Take(now)
	}
	now += sec / 10
	w1 := p.Want(now, ahead, 1000)
	for range 50 {
		p.Take(now)
	}
	now += sec / 10
	w2 := p.Want(now, ahead, 1000)
	if w1 != 150 || w2 != 150 {
		t.Fatalf("Want after demand of 500/s = %d then %d, want 150", w1, w2)
	}
	p.Grant(40, now+sec, now)
	for range 50 {
		p.Take(now)
	}
	now += sec / 10
	if w := p.Want(now, ahead, 1000); w > w2 {
		t.Fatalf("Want with tokens in hand = %d, want less than %d", w, w2)
	}
	for range 500 {
		p.Take(now)
	}
	if w := p.Want(now+sec/10, ahead, 7); w != 7 {
		t.Fatalf("Want capped at 7 = %d", w)
	}
}
