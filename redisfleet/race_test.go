//go:build race

package redisfleet

// raceOn says the tests run under the race detector, which slows every
// goroutine (the pods' and their Redis clients') several times over.
const raceOn = true
