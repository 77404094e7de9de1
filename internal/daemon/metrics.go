package daemon

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/target"
)

// Metrics go through prometheus/client_golang: a registry per daemon with the Go and process
// collectors (go_*, process_*) and srpdCollector, which reads the engine's counters at scrape
// time. Nothing on the I/O path touches client_golang: the target keeps plain atomic counters
// per channel and per LUN (target/lunstats.go) and the daemon's histograms are lock-free
// arrays (histogram.go); Collect turns snapshots of them into const metrics.
//
// Metric names follow Prometheus conventions: srpd_ prefix, _total counters, base units.
//
// frpool state (free/registering/valid/invalidating MRs) is not exported: neither the target's
// channels nor the initiator's sessions expose their pools' statistics; the target's registered
// MRs and memory are (srpd_target_mrs, srpd_target_registered_memory_bytes).

var nakCodes = [5]string{"psn_sequence", "invalid_request", "remote_access", "remote_operational", "other"}

// causeNames label login rejects: the target's cause names in snake case.
var causeNames = func() []string {
	var out []string
	for c := target.RejectCause(0); int(c) < target.NumRejectCauses; c++ {
		out = append(out, strings.ReplaceAll(c.String(), " ", "_"))
	}
	return out
}()

// senseKeyNames label the per-LUN CHECK CONDITION errors: SPC's sense key names in snake case.
var senseKeyNames = func() [16]string {
	var out [16]string
	for k := range out {
		out[k] = snake(scsi.SenseKey(k).String())
	}
	return out
}()

// usualSenseKeys are the sense keys whose error series every LUN has from the start (so that
// rate() sees their first increment); the others appear at their first error.
var usualSenseKeys = [...]scsi.SenseKey{scsi.NotReady, scsi.MediumError, scsi.HardwareError,
	scsi.IllegalRequest, scsi.UnitAttention, scsi.DataProtect, scsi.AbortedCommand, scsi.Miscompare}

func snake(s string) string {
	return strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(strings.ToLower(s))
}

// newRegistry returns the daemon's metrics registry.
func (d *Daemon) newRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&srpdCollector{d: d, descs: map[string]*prometheus.Desc{}})
	return r
}

// metricsHandler serves GET /metrics from the registry. A collection error (a bug: a family
// emitted with inconsistent labels or help) is logged and the other families are served.
func (d *Daemon) metricsHandler() http.Handler {
	return promhttp.HandlerFor(d.registry, promhttp.HandlerOpts{
		ErrorLog:            zap.NewStdLog(d.log.Named("metrics")),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
	})
}

// srpdCollector collects srpd's own metrics. It is an unchecked collector (Describe sends
// nothing): which families and label sets exist follows the configuration (transports, targets,
// LUNs, connections) and changes with every reload; the registry still checks each scrape for
// duplicate series and inconsistent families.
type srpdCollector struct {
	d *Daemon

	mu    sync.Mutex
	descs map[string]*prometheus.Desc // by name and label names
}

func (c *srpdCollector) Describe(chan<- *prometheus.Desc) {}

func (c *srpdCollector) Collect(out chan<- prometheus.Metric) {
	c.d.collect(&emitter{c: c, out: out})
}

// emitter turns samples into const metrics. Label sets are given as name, value pairs.
type emitter struct {
	c   *srpdCollector
	out chan<- prometheus.Metric
}

func (e *emitter) desc(name, help string, kv []string) (*prometheus.Desc, []string) {
	names := make([]string, 0, len(kv)/2)
	values := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		names = append(names, kv[i])
		values = append(values, kv[i+1])
	}
	key := name + "\x00" + strings.Join(names, "\x00")
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	d := e.c.descs[key]
	if d == nil {
		d = prometheus.NewDesc(name, help, names, nil)
		e.c.descs[key] = d
	}
	return d, values
}

func (e *emitter) send(m prometheus.Metric, err error) {
	if err != nil {
		m = prometheus.NewInvalidMetric(prometheus.NewInvalidDesc(err), err)
	}
	e.out <- m
}

func (e *emitter) counter(name, help string, v uint64, kv ...string) {
	d, lv := e.desc(name, help, kv)
	e.send(prometheus.NewConstMetric(d, prometheus.CounterValue, float64(v), lv...))
}

func (e *emitter) gauge(name, help string, v float64, kv ...string) {
	d, lv := e.desc(name, help, kv)
	e.send(prometheus.NewConstMetric(d, prometheus.GaugeValue, v, lv...))
}

// histogram emits a latency histogram (target.LatencyBounds, in seconds).
func (e *emitter) histogram(name, help string, h target.LatencyHistogram, kv ...string) {
	d, lv := e.desc(name, help, kv)
	bounds := target.LatencyBounds()
	buckets := make(map[float64]uint64, len(bounds))
	var cum uint64
	for i, ub := range bounds {
		cum += h.Buckets[i]
		buckets[ub] = cum
	}
	e.send(prometheus.NewConstHistogram(d, h.Count(), float64(h.SumNS)/1e9, buckets, lv...))
}

// collect emits srpd's metrics from the engine's counters.
func (d *Daemon) collect(e *emitter) {
	d.mu.RLock()
	defer d.mu.RUnlock()

	e.gauge("srpd_build_info", "srpd's version.", 1, "version", d.version)
	e.gauge("srpd_start_time_seconds", "When srpd started (Unix time).", float64(d.started.UnixNano())/1e9)
	e.counter("srpd_config_reloads_total", "Configuration reloads (SIGHUP or API).", d.reloads.Load())
	e.counter("srpd_config_reload_failures_total", "Reloads that were refused or applied with failures.", d.reloadFailures.Load())
	e.counter("srpd_config_api_changes_total", "Configuration changes made through the control API.", d.mutations.Load())
	e.gauge("srpd_failed_objects", "Configured objects (transports, targets, sessions, metrics) that are not running, initiator sessions failing to log in included.", float64(len(d.healthLocked().Failed)))

	if b := d.budget; b != nil {
		u, bc := b.Usage(), b.Config()
		e.gauge("srpd_admission_sessions", "Sessions of all targets holding a session slot.", float64(u.Sessions))
		e.gauge("srpd_admission_sessions_limit", "The daemon-wide session bound (limits.max_sessions; 0: none).", float64(bc.MaxSessions))
		e.gauge("srpd_admission_registered_memory_bytes", "Registered memory reserved by the channels of all targets.", float64(u.Memory))
		e.gauge("srpd_admission_registered_memory_limit_bytes", "The daemon-wide registered memory bound (limits.max_registered_memory; 0: none).", float64(bc.MaxMemory))
		e.gauge("srpd_admission_pending_logins", "Logins waiting for their RTU (half-open).", float64(u.PendingLogins))
		e.counter("srpd_admission_pending_logins_evicted_total", "Pending logins ended early to make room for newer requests.", u.Evicted)
		e.counter("srpd_admission_pending_logins_timed_out_total", "Pending logins whose RTU did not come within the login timeout.", u.TimedOut)
		e.counter("srpd_admission_rate_limited_total", "Connection requests rejected by the per-source login rate.", u.RateLimited)
	}

	for _, name := range sortedKeys(d.transports) {
		t := d.transports[name]
		s, cm, ok := t.SoftRoCEStats()
		if !ok {
			continue // the kernel verbs engine keeps its counters in the kernel (rdma statistic)
		}
		l := []string{"transport", name}
		e.counter("srpd_softroce_tx_packets_total", "RoCEv2 packets sent.", s.TxPackets, l...)
		e.counter("srpd_softroce_rx_packets_total", "RoCEv2 packets received (after the ICRC check).", s.RxPackets, l...)
		e.counter("srpd_softroce_tx_bytes_total", "RoCEv2 bytes sent.", s.TxBytes, l...)
		e.counter("srpd_softroce_rx_bytes_total", "RoCEv2 bytes received.", s.RxBytes, l...)
		e.counter("srpd_softroce_loopback_packets_total", "RoCEv2 packets the transport sent to itself without the network (a target and a session of this daemon on one transport).", s.LoopPackets, l...)
		e.counter("srpd_softroce_loopback_bytes_total", "RoCEv2 bytes the transport sent to itself.", s.LoopBytes, l...)
		e.counter("srpd_softroce_loopback_drops_total", "Packets to itself dropped because the loopback queue was full (RC retries recover them).", s.LoopDrops, l...)
		e.counter("srpd_softroce_retransmits_total", "Packets sent again by go-back-N retries.", s.Retransmits, l...)
		e.counter("srpd_softroce_retry_events_total", "Retries started (NAK, timeout, RNR).", s.RetryEvents, l...)
		e.counter("srpd_softroce_ack_timeouts_total", "Local ACK timeouts.", s.Timeouts, l...)
		e.counter("srpd_softroce_retry_exceeded_total", "QPs that ran out of transport retries.", s.RetryExceeded, l...)
		e.counter("srpd_softroce_rnr_retry_exceeded_total", "QPs that ran out of RNR retries.", s.RNRRetryExceeded, l...)
		for i, code := range nakCodes {
			e.counter("srpd_softroce_naks_sent_total", "NAKs sent, by code.", s.NAKsSent[i], "transport", name, "code", code)
		}
		for i, code := range nakCodes {
			e.counter("srpd_softroce_naks_received_total", "NAKs received, by code.", s.NAKsRcvd[i], "transport", name, "code", code)
		}
		e.counter("srpd_softroce_rnr_naks_sent_total", "RNR NAKs sent.", s.RNRNAKsSent, l...)
		e.counter("srpd_softroce_rnr_naks_received_total", "RNR NAKs received.", s.RNRNAKsRcvd, l...)
		e.counter("srpd_softroce_out_of_sequence_total", "Requests with a PSN beyond the expected one (dropped).", s.OutOfSequence, l...)
		e.counter("srpd_softroce_duplicates_total", "Duplicate requests.", s.Duplicates, l...)
		e.counter("srpd_softroce_icrc_drops_total", "Packets dropped for a bad ICRC.", s.ICRCDrops, l...)
		e.counter("srpd_softroce_icrc_waived_total", "Packets from srpd peers accepted without an ICRC (negotiated; keep_icrc turns it off).", s.ICRCWaived, l...)
		e.counter("srpd_softroce_payload_refs_total", "Packets to srpd peers sent with their payload read by the kernel straight from registered memory (no copy into a packet buffer).", s.TxRefPackets, l...)
		e.counter("srpd_softroce_link_drops_total", "Packets dropped by the link (malformed, queue overflow).", s.LinkDrops, l...)
		e.counter("srpd_softroce_engine_drops_total", "Packets dropped by the engine (no QP, wrong state, bad header).", s.Dropped, l...)
		e.counter("srpd_softroce_cq_overruns_total", "Completion queue overruns.", s.CQOverruns, l...)
		e.counter("srpd_softroce_busy_polls_total", "Receives that found the UDP socket empty and polled it (busy_poll).", s.BusyPolls, l...)
		e.counter("srpd_softroce_busy_poll_hits_total", "Busy polls that found a packet before they ended.", s.BusyPollHits, l...)
		e.counter("srpd_softroce_busy_poll_skips_total", "Empty receives that slept without polling: they followed a run of packets (a pipelining peer).", s.BusyPollSkips, l...)
		e.counter("srpd_softroce_held_packets_total", "Packets of posts inside a post bracket (an NBD read's requests), sent together.", s.HeldPackets, l...)
		e.counter("srpd_softroce_held_sends_total", "Link sends that carried held packets.", s.HeldSends, l...)
		e.counter("srpd_softroce_cm_mads_received_total", "Connection-management MADs received.", cm.RxMADs, l...)
		e.counter("srpd_softroce_cm_mads_sent_total", "Connection-management MADs sent.", cm.TxMADs, l...)
		if sd := t.SoftRoCE(); sd != nil {
			if qs := sd.QueueStats(); len(qs) > 1 {
				for i, q := range qs {
					ql := []string{"transport", name, "queue", strconv.Itoa(i)}
					e.counter("srpd_softroce_queue_rx_packets_total", "RoCEv2 packets received, by receive queue (transport queues).", q.RxPackets, ql...)
					e.counter("srpd_softroce_queue_tx_packets_total", "RoCEv2 packets sent, by queue.", q.TxPackets, ql...)
					e.counter("srpd_softroce_queue_forwarded_total", "Packets a queue received for another queue's QP or connection and handed over (CM MADs; GRO runs of mixed QPs).", q.Forwarded, ql...)
				}
			}
		}
	}

	for _, name := range sortedKeys(d.targets) {
		t := d.targets[name]
		st := t.Port.Stats()
		l := []string{"target", name}
		e.gauge("srpd_target_sessions", "Initiators logged in (I_T nexuses).", float64(st.Sessions), l...)
		e.gauge("srpd_target_channels", "Live RDMA channels.", float64(st.Channels), l...)
		e.counter("srpd_target_logins_total", "Logins, by result.", st.LoginsAccepted, "target", name, "result", "accepted")
		e.counter("srpd_target_logins_total", "Logins, by result.", st.LoginsRejected, "target", name, "result", "rejected")
		e.counter("srpd_target_logins_unfinished_total", "Accepted logins whose connection never completed (no RTU in time, or evicted by newer requests): what forged connection requests cost.", st.LoginsUnfinished, l...)
		for i, n := range causeNames {
			if i < len(st.Rejects) && st.Rejects[i] > 0 {
				e.counter("srpd_target_login_rejects_total", "Rejected logins, by cause.", st.Rejects[i], "target", name, "cause", n)
			}
		}
		e.counter("srpd_target_commands_total", "SCSI commands received (IOPS: rate of this).", st.Commands, l...)
		e.counter("srpd_target_read_bytes_total", "Data-in bytes sent to initiators (reads).", st.BytesIn, l...)
		e.counter("srpd_target_write_bytes_total", "Data-out bytes received from initiators (writes).", st.BytesOut, l...)
		e.counter("srpd_target_errors_total", "Commands that failed plus transport errors.", st.Errors, l...)
		e.counter("srpd_target_keepalive_timeouts_total", "Channels closed because the peer did not acknowledge a keep-alive probe (gone without a DREQ).", st.KeepAliveTimeouts, l...)
		e.counter("srpd_target_stalls_total", "Commands found stalled on the transport (RDMA transfer or response send past stall_timeout).", st.Stalls, l...)
		e.counter("srpd_target_teardown_timeouts_total", "Channels whose drain hit the teardown timeout.", st.TeardownTimeouts, l...)
		e.gauge("srpd_target_mrs", "Registered memory regions held by the channels.", float64(st.MRs), l...)
		e.gauge("srpd_target_registered_memory_bytes", "Memory registered by the channels.", float64(st.MemoryBytes), l...)
		var granted, reqLim, pending int64
		sessions := t.Port.Sessions()
		names := t.sessionNames(sessions)
		for i, ss := range sessions {
			for _, c := range ss.Channels {
				granted += int64(c.QueueDepth)
				reqLim += c.ReqLim
				pending += c.PendingCredits
				cl := []string{"target", name, "session", names[i], "channel", strconv.FormatUint(c.ID, 10)}
				e.gauge("srpd_target_channel_credits_granted", "Credits granted to a channel at login (its queue depth).", float64(c.QueueDepth), cl...)
				e.gauge("srpd_target_channel_credits_available", "Credits a channel's initiator holds now (its request limit as the target accounts it).", float64(c.ReqLim), cl...)
				e.gauge("srpd_target_channel_credits_pending", "Credits a channel owes its initiator (aborted commands), not yet returned.", float64(c.PendingCredits), cl...)
			}
		}
		e.gauge("srpd_target_credits_granted", "Credits granted at login, summed over live channels.", float64(granted), l...)
		e.gauge("srpd_target_credits_available", "Credits the initiators hold now (request limit), summed over live channels.", float64(reqLim), l...)
		e.gauge("srpd_target_credits_pending", "Credits owed to initiators, not yet returned.", float64(pending), l...)
		for _, id := range sortedKeys(t.luns) {
			lr := t.luns[id]
			ls := strconv.Itoa(id)
			e.gauge("srpd_target_lun_capacity_bytes", "LUN capacity.", float64(lr.Capacity), "target", name, "lun", ls)
			if owned, fences, ok := lr.LockState(); ok {
				e.gauge("srpd_target_lun_lock_owner", "1 when this gateway owns the LUN's exclusive lock (an RBD image with the managed lock).",
					b2f(owned), "target", name, "lun", ls)
				e.counter("srpd_target_lun_fences_total", "Times another gateway took the LUN's exclusive lock over, fencing this one.",
					fences, "target", name, "lun", ls)
			}
			e.lunStats(name, ls, t.lunStats(lr))
			for _, op := range []struct {
				n string
				h *histogram
			}{{"read", &lr.io.read}, {"write", &lr.io.write}, {"flush", &lr.io.flush}} {
				e.histogram("srpd_target_backend_io_duration_seconds", "Backend I/O latency of a LUN (reads, writes, flushes).", op.h.snapshot(),
					"target", name, "lun", ls, "op", op.n)
			}
		}
	}

	for _, name := range sortedKeys(d.conns) {
		c := d.conns[name]
		st, sess := c.stats()
		l := []string{"connection", name}
		up := 0.0
		if sess != nil {
			up = 1
		}
		c.mu.Lock()
		attempts, exps := c.attempts, c.exports
		c.mu.Unlock()
		e.gauge("srpd_connection_up", "1 when the initiator session to the target is logged in.", up, l...)
		e.gauge("srpd_connection_channels", "Live channels of the initiator session.", float64(st.LiveChannels), l...)
		e.counter("srpd_connection_logins_total", "Session login attempts (the first and after a session loss).", attempts, l...)
		e.counter("srpd_connection_commands_total", "SCSI commands completed by the target.", st.Commands, l...)
		e.counter("srpd_connection_retries_total", "Commands re-issued.", st.Retries, l...)
		e.counter("srpd_connection_timeouts_total", "Commands that timed out.", st.Timeouts, l...)
		e.counter("srpd_connection_task_mgmt_total", "Task management functions sent.", st.TaskMgmt, l...)
		e.counter("srpd_connection_reconnects_total", "Channel reconnections.", st.Reconnects, l...)
		e.counter("srpd_connection_credit_waits_total", "Submissions that waited for SRP credits.", st.CreditWaits, l...)
		e.counter("srpd_connection_read_bytes_total", "Data-in bytes of reads that completed GOOD.", st.BytesRead, l...)
		e.counter("srpd_connection_write_bytes_total", "Data-out bytes of writes that completed GOOD.", st.BytesWritten, l...)
		for _, x := range exps {
			ls := []string{"connection", name, "lun", strconv.Itoa(x.lun)}
			if x.x != nil {
				ns := x.x.Server.Stats()
				var reads, writes, br, bw, errs, reqs, stalled uint64
				conns := 0
				for _, ex := range ns.Exports {
					stalled += ex.StalledClosed
					reads += ex.Reads
					writes += ex.Writes
					br += ex.BytesRead
					bw += ex.BytesWritten
					errs += ex.Errors
					reqs += ex.Requests
					conns += ex.Conns
				}
				e.gauge("srpd_nbd_connections", "NBD clients connected to an export.", float64(conns), ls...)
				e.counter("srpd_nbd_requests_total", "NBD requests answered.", reqs, ls...)
				e.counter("srpd_nbd_reads_total", "NBD reads.", reads, ls...)
				e.counter("srpd_nbd_writes_total", "NBD writes.", writes, ls...)
				e.counter("srpd_nbd_read_bytes_total", "Bytes sent in NBD read replies.", br, ls...)
				e.counter("srpd_nbd_written_bytes_total", "Bytes of successful NBD writes.", bw, ls...)
				e.counter("srpd_nbd_errors_total", "NBD replies with an error.", errs, ls...)
				e.counter("srpd_nbd_stalled_closed_total", "NBD connections closed because their client did not read replies within write_timeout.", stalled, ls...)
				e.counter("srpd_nbd_refused_total", "NBD connections refused for max_connections.", ns.Refused, ls...)
				e.gauge("srpd_nbd_buffer_bytes", "Bytes held in an export's request buffers (in use or free).", float64(ns.BufferBytes), ls...)
				e.gauge("srpd_nbd_buffer_budget_bytes", "An export's request buffer budget.", float64(ns.BufferBudget), ls...)
			}
			for _, op := range []struct {
				n string
				h *histogram
			}{{"read", &x.io.read}, {"write", &x.io.write}, {"flush", &x.io.flush}} {
				e.histogram("srpd_nbd_request_duration_seconds", "Latency of NBD requests through the SRP initiator (reads, writes, flushes).", op.h.snapshot(),
					"connection", name, "lun", strconv.Itoa(x.lun), "op", op.n)
			}
		}
	}
}

// lunStats emits the per-LUN I/O counters of LUN lun of target tgt.
func (e *emitter) lunStats(tgt, lun string, s target.LUNStats) {
	for op := range target.NumLUNOps {
		kv := []string{"target", tgt, "lun", lun, "op", op.String()}
		e.counter("srpd_target_lun_commands_total", "SCSI commands a LUN answered, by operation (read, write, other).", s.Commands[op], kv...)
		e.histogram("srpd_target_lun_command_duration_seconds",
			"Latency of a LUN's commands, from the SRP_CMD's arrival to its SRP_RSP, by operation (read, write, other).", s.Latency[op], kv...)
	}
	e.counter("srpd_target_lun_read_bytes_total", "Data-in bytes a LUN's commands sent to initiators.", s.ReadBytes, "target", tgt, "lun", lun)
	e.counter("srpd_target_lun_write_bytes_total", "Data-out bytes a LUN's commands received from initiators.", s.WriteBytes, "target", tgt, "lun", lun)
	const errHelp = "Commands of a LUN answered with a status other than GOOD, by status and, for CHECK CONDITION, sense key; the unit attention of a new login is not one."
	usual := [16]bool{}
	for _, k := range usualSenseKeys {
		usual[k] = true
	}
	for k, n := range s.SenseErrors {
		if n > 0 || usual[k] {
			e.counter("srpd_target_lun_errors_total", errHelp, n, "target", tgt, "lun", lun, "status", "check_condition", "sense_key", senseKeyNames[k])
		}
	}
	for i, n := range s.StatusErrors {
		e.counter("srpd_target_lun_errors_total", errHelp, n, "target", tgt, "lun", lun, "status", target.StatusErrName(i), "sense_key", "none")
	}
	e.counter("srpd_target_lun_reset_unit_attentions_total",
		"POWER ON/RESET unit attentions a LUN reported: one for each new login (I_T nexus) that addresses it, not an error.", s.ResetUAs, "target", tgt, "lun", lun)
}

func sortedKeys[K int | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// b2f is a boolean gauge's value.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
