package fuse

import (
	"testing"
	"unsafe"
)

// TestShrinkMessage: a request that fits a page is moved out of its
// bufSize buffer (which a lock wait would otherwise hold for as long as it
// waits), into a tiny one if it fits tinyBufSize; one that does not fit a
// page, a large write, keeps it. Each goes back to the pool of its size.
func TestShrinkMessage(t *testing.T) {
	m := getMessage(nil)
	if cap(m.buf) < bufSize {
		t.Fatalf("read buffer of %d bytes, want %d", cap(m.buf), bufSize)
	}
	copy(m.buf, "0123456789")
	sm := shrinkMessage(m, 10)
	if cap(sm.buf) != tinyBufSize || string(sm.buf[:10]) != "0123456789" {
		t.Fatalf("tiny request: buffer of %d bytes holding %q", cap(sm.buf), sm.buf[:10])
	}
	if &sm.buf[0] != (*byte)(unsafe.Pointer(sm.hdr)) {
		t.Fatal("header does not point into the tiny buffer")
	}
	putMessage(sm)

	m = getMessage(nil)
	copy(m.buf[tinyBufSize:], "0123456789")
	sm = shrinkMessage(m, tinyBufSize+10)
	if cap(sm.buf) != smallBufSize || string(sm.buf[tinyBufSize:tinyBufSize+10]) != "0123456789" {
		t.Fatalf("small request: buffer of %d bytes", cap(sm.buf))
	}
	putMessage(sm)
	if again := tinyPool.Get().(*message); cap(again.buf) != tinyBufSize {
		t.Errorf("the tiny pool gave a buffer of %d bytes", cap(again.buf))
	}

	m = getMessage(nil)
	if big := shrinkMessage(m, smallBufSize+1); big != m {
		t.Fatal("a request larger than a page was copied")
	}
	putMessage(m)
}

// TestConnSpareBuffers: a connection's read buffers come back to it, not
// to the pool that every garbage collection empties.
func TestConnSpareBuffers(t *testing.T) {
	c := &Conn{}
	m := getMessage(c)
	putMessage(m)
	if len(c.spare) != 1 {
		t.Fatalf("%d spare buffers after one read, want 1", len(c.spare))
	}
	if again := getMessage(c); again != m {
		t.Error("the next read did not reuse the spare buffer")
	}
	var held []*message
	for i := 0; i < maxSpare+3; i++ {
		held = append(held, getMessage(c))
	}
	for _, m := range held {
		putMessage(m)
	}
	if len(c.spare) != maxSpare {
		t.Errorf("%d spare buffers, want at most %d", len(c.spare), maxSpare)
	}
}
