package cm

import "time"

// timerHeap is an indexed binary min-heap of connections ordered by deadline (ties by arming
// sequence, so that expiry order is deterministic). Each connection has at most one timer;
// conn.heapIdx is its position or -1.
type timerHeap struct {
	items []*conn
	seq   uint64
}

func (h *timerHeap) less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if a.deadline != b.deadline {
		return a.deadline < b.deadline
	}
	return a.timerSeq < b.timerSeq
}

func (h *timerHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].heapIdx = i
	h.items[j].heapIdx = j
}

func (h *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// set (re)arms c for deadline d.
func (h *timerHeap) set(c *conn, d time.Duration) {
	h.seq++
	c.deadline, c.timerSeq = d, h.seq
	if c.heapIdx >= 0 {
		h.up(c.heapIdx)
		h.down(c.heapIdx)
		return
	}
	c.heapIdx = len(h.items)
	h.items = append(h.items, c)
	h.up(c.heapIdx)
}

// remove disarms c (no-op if not armed).
func (h *timerHeap) remove(c *conn) {
	i := c.heapIdx
	if i < 0 {
		return
	}
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	c.heapIdx = -1
	if i != last {
		h.up(i)
		h.down(i)
	}
}

// peek returns the connection with the earliest deadline, or nil.
func (h *timerHeap) peek() *conn {
	if len(h.items) == 0 {
		return nil
	}
	return h.items[0]
}
