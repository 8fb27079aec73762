//go:build !race

package redisfleet

const raceOn = false
