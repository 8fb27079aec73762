package bulwark_test

// Black-box tests of bulwark against bulwarktest's scripted upstream, over
// a real socket where connections matter and in memory, in a synctest
// bubble, where time does.

import (
	"net/http"
	"time"
)

// noWait is a Backoff of no wait, for tests on a real server, which cannot
// run in a synctest bubble and would otherwise sleep.
func noWait(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 }
