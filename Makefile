# bulwark's build. `make test` is what CI runs (.ci/run); it must stay well
# under ten minutes on two cores. Longer runs live behind soak, fuzz, bench.

GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Every module in the repository: the library at the root and the nested
# modules (examples, bench, integration, redisfleet) that keep their
# dependencies out of its go.mod.
MODULES     := $(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*' | sort))
FUZZTIME    ?= 20s

.PHONY: test vet staticcheck unit demo bench fuzz soak

# Each phase says what it does and, when it ends, how long it took (wall
# seconds from date +%s), so a long silence is never a hang in disguise.
test: vet staticcheck unit
	@echo "make test: all phases passed"

vet:
	@t0=$$(date +%s); echo "== gofmt and go vet, every module ($(words $(MODULES)) modules)"; \
		out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi; \
		for m in $(MODULES); do echo "   go vet $$m"; (cd $$m && $(GO) vet ./...) || exit 1; done; \
		echo "   gofmt and vet took $$(( $$(date +%s) - t0 ))s"

# The first run downloads staticcheck through the Go module proxy.
staticcheck:
	@t0=$$(date +%s); echo "== staticcheck, every module (the first run downloads and builds $(STATICCHECK))"; \
		for m in $(MODULES); do echo "   staticcheck $$m"; (cd $$m && $(GO) run $(STATICCHECK) ./...) || exit 1; done; \
		echo "   staticcheck took $$(( $$(date +%s) - t0 ))s"

unit:
	@t0=$$(date +%s); echo "== go test -race, every module (the examples' lab runs its scenarios in testing/synctest bubbles, then the whole lab once on 127.0.0.1: about half a minute)"; \
		for m in $(MODULES); do t1=$$(date +%s); echo "   go test -race $$m"; \
			(cd $$m && $(GO) test -race -count=1 -timeout 8m ./...) || exit 1; \
			echo "   $$m took $$(( $$(date +%s) - t1 ))s"; done; \
		echo "   the tests took $$(( $$(date +%s) - t0 ))s"

# The main job: the resilience lab replays well-known outages (Release It!,
# Google's SRE book, the AWS Builders' Library, "The Tail at Scale") on
# 127.0.0.1, plain client against bulwark, in about a minute and a half: a
# verdict per scenario, tables, sparklines and an HTML report.
# `go run ./lab -h` for flags.
demo:
	cd examples && $(GO) run ./lab

# Cost benchmarks of bulwark and its peers (bench/, -count 6 for benchstat),
# the protection scenarios, the fleet lab (redisfleet/cmd/fleetlab, 8
# processes and a redis-server; it needs redis-server) with the fleet's cost
# beside gobreaker's DistributedCircuitBreaker, BENCHMARKS.md rendered from
# their output, and the README's peers table from BENCHMARKS.md.
BENCHSTAT := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
BENCHTIME ?= 300ms
# How long bench/cmd/hedge offers each stack each scenario (the issue's 20 s).
HEDGETIME ?= 20s
bench:
	mkdir -p bench/out
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -cpu 1,2 -count 6 -timeout 30m . > out/cost.txt
	cd bench && $(GO) run $(BENCHSTAT) out/cost.txt > out/benchstat.txt
	cd bench && $(GO) run ./cmd/protect > out/protect.jsonl
	cd bench && $(GO) run ./cmd/hedge -duration $(HEDGETIME) > out/hedge.md
	cd redisfleet && $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 6 . > ../bench/out/fleetcost.txt
	cd redisfleet && $(GO) run ./cmd/fleetlab -runs 10 -scenarios breaker,quota,outage,push -markdown -cost ../bench/out/fleetcost.txt > ../bench/out/fleet.md
	cd redisfleet && $(GO) test -tags fleetlong -count=1 -v -run TestSickPodLong -timeout 10m . > ../bench/out/sickpod.txt
	cd bench && $(GO) run ./cmd/adaptive > out/adaptive.md
	cd bench && $(GO) run ./cmd/report -cost out/cost.txt -benchstat out/benchstat.txt -protect out/protect.jsonl -hedge out/hedge.md -adaptive out/adaptive.md -fleet out/fleet.md > ../BENCHMARKS.md
	cd bench && $(GO) run ./cmd/readme -bench ../BENCHMARKS.md -readme ../README.md

# Each fuzz target of the library's packages for a bounded time ($(FUZZTIME)
# each): go test -fuzz takes one target and one package per run, hence the
# loops over the packages and their -list.
FUZZPKGS    := . ./server ./internal/wire
fuzz:
	@for p in $(FUZZPKGS); do for f in $$($(GO) test -list '^Fuzz' $$p | grep '^Fuzz'); do \
		echo "fuzz $$p $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; done; done

# The long stress (transport_soak_test.go, build tag soak): 200,000 calls under -race.
soak:
	$(GO) test -race -count=1 -timeout 30m -run '^TestSoak$$' -tags soak -v .
