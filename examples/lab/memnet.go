package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// memNet is an in-memory network for the lab's servers and clients, so a
// test can run a scenario inside a testing/synctest bubble: there time is
// fake and moves only when every goroutine waits, so what a scenario
// measures no longer depends on how fast a loaded machine runs it. Real
// sockets would block outside the bubble's view; net.Pipe connections
// block on channels, which the bubble sees. The lab itself (make demo)
// always uses 127.0.0.1; only tests set inMemory.
type memNet struct {
	mu        sync.Mutex
	next      int
	listeners map[string]*memListener
}

// inMemory, when set, is the network startServer and loopbackTransport
// use instead of 127.0.0.1. Tests set it for the length of one bubble.
var inMemory *memNet

func newMemNet() *memNet { return &memNet{listeners: map[string]*memListener{}} }

// listen returns a listener at a fresh address that looks like loopback.
func (n *memNet) listen() *memListener {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	l := &memListener{net: n, addr: memAddr(fmt.Sprintf("127.0.0.1:%d", 20000+n.next)),
		conns: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[string(l.addr)] = l
	return l
}

// dial connects to a listener of n, as net.Dialer.DialContext would.
func (n *memNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
}

type memListener struct {
	net   *memNet
	addr  memAddr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.net.mu.Lock()
		delete(l.net.listeners, string(l.addr))
		l.net.mu.Unlock()
	})
	return nil
}

func (l *memListener) Addr() net.Addr { return l.addr }

type memAddr string

func (a memAddr) Network() string { return "tcp" }
func (a memAddr) String() string  { return string(a) }
