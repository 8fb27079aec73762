package redisfleet_test

import (
	"context"
	"log"
	"log/slog"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
	"github.com/bulwark-http/bulwark/redisfleet"
	"github.com/redis/go-redis/v9"
)

// These Examples are the README's redisfleet blocks as written. They have
// no "// Output:" and so are compiled, not run: each needs a Redis server
// at the address it names ("redis:6379", a Cluster, Sentinels), which a
// test cannot assume. The package's tests run the same calls against a
// redis-server they start (redis_test.go, cluster_test.go,
// sentinel_test.go, configpush_test.go), and skip when none is installed.

// One Redis node shared by the fleet: the README's "A fleet that acts as
// one" block.
func ExampleNew() {
	// README "A fleet that acts as one": begin
	rc := redis.NewClient(&redis.Options{Addr: "redis:6379",
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	fleet, err := redisfleet.New(rc, redisfleet.Options{Prefix: "myapp:bulwark:"})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := bulwark.New(bulwark.Config{Fleet: fleet})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close() // stops the fleet goroutines
	// README "A fleet that acts as one": end
}

// A Redis Cluster: any nodes' addresses, and a shorter slot-map reload for
// the client's other commands.
func ExampleNew_cluster() {
	// README "On a Cluster": begin
	rc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:       []string{"redis-0:6379", "redis-1:6379", "redis-2:6379"},
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1,
		ClusterStateReloadInterval: 10 * time.Second, // for your other commands
	})
	// README "On a Cluster": end
	fleet, err := redisfleet.New(rc, redisfleet.Options{Prefix: "myapp:bulwark:"})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := bulwark.New(bulwark.Config{Fleet: fleet})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
}

// Redis behind Sentinels: the failover client.
func ExampleNew_sentinel() {
	// README "With Sentinel": begin
	rc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: "bulwark", SentinelAddrs: []string{"sentinel-0:26379", "sentinel-1:26379", "sentinel-2:26379"},
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1,
	})
	// README "With Sentinel": end
	fleet, err := redisfleet.New(rc, redisfleet.Options{Prefix: "myapp:bulwark:"})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := bulwark.New(bulwark.Config{Fleet: fleet})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
}

// go-redis's own log lines, at Debug in the program's logger.
func ExampleDebugLog() {
	logger := slog.Default()
	redis.SetLogger(redisfleet.DebugLog{Logger: logger})
}

// The policies file pushed to the fleet (bulwarkctl push), followed by
// each process: the README's "Configuration pushed to the fleet" block.
func ExampleFleet_ConfigFollower() {
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: "redis:6379",
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	fleet, err := redisfleet.New(rc, redisfleet.Options{Prefix: "myapp:bulwark:", ID: "pod-0"})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := bulwark.New(bulwark.Config{Fleet: fleet})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	var reg config.Registry // the functions the pushed files may name

	// README "Configuration pushed to the fleet": begin
	// It reports what it runs under the fleet's Options.ID.
	fl := fleet.ConfigFollower(tr, redisfleet.FollowOptions{Registry: reg})
	go fl.Run(ctx) // applies the latest version now, then each push, with tr.Update
	// README "Configuration pushed to the fleet": end
}
