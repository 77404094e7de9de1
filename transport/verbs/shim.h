// shim.h: C helpers of the verbs engine (see shim.go). Every function is static: each cgo
// file of the package includes this header and gets its own copy.
#ifndef SRPD_VERBS_SHIM_H
#define SRPD_VERBS_SHIM_H
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ---- devices ------------------------------------------------------------------------------

static int shim_device_names(char *buf, int len) {
	int n = 0, off = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return -errno;
	buf[0] = 0;
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		int l = strlen(name);
		if (off + l + 2 > len)
			break;
		memcpy(buf + off, name, l);
		off += l;
		buf[off++] = '\n';
		buf[off] = 0;
	}
	ibv_free_device_list(list);
	return n;
}

// shim_open returns librdmacm's context of the named device (so that cm_id->verbs is the
// context our PDs, CQs and QPs live in) and the list that holds it.
static struct ibv_context *shim_open(const char *name, struct ibv_context ***listp) {
	int n = 0;
	struct ibv_context **list = rdma_get_devices(&n);
	if (!list)
		return NULL;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]->device), name) == 0) {
			*listp = list;
			return list[i];
		}
	}
	rdma_free_devices(list);
	errno = ENODEV;
	return NULL;
}

static const char *shim_ctx_name(struct ibv_context *ctx) { return ibv_get_device_name(ctx->device); }

struct shim_devattr {
	uint64_t max_mr_size, page_size_cap, device_cap_flags;
	int32_t max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd, max_mw;
	int32_t max_qp_rd_atom, max_qp_init_rd_atom, atomic_cap;
	uint32_t vendor_id, max_msg_sz;
	int32_t port_state, max_mtu, active_mtu, gid_tbl_len, link_layer, phys_port_cnt;
};

static int shim_query(struct ibv_context *ctx, int port, struct shim_devattr *a) {
	struct ibv_device_attr d;
	struct ibv_port_attr p;
	int r = ibv_query_device(ctx, &d);
	if (r)
		return r;
	r = ibv_query_port(ctx, port, &p);
	if (r)
		return r;
	a->max_mr_size = d.max_mr_size;
	a->page_size_cap = d.page_size_cap;
	a->device_cap_flags = d.device_cap_flags;
	a->max_qp = d.max_qp;
	a->max_qp_wr = d.max_qp_wr;
	a->max_sge = d.max_sge;
	a->max_cq = d.max_cq;
	a->max_cqe = d.max_cqe;
	a->max_mr = d.max_mr;
	a->max_pd = d.max_pd;
	a->max_mw = d.max_mw;
	a->max_qp_rd_atom = d.max_qp_rd_atom;
	a->max_qp_init_rd_atom = d.max_qp_init_rd_atom;
	a->atomic_cap = d.atomic_cap;
	a->vendor_id = d.vendor_id;
	a->phys_port_cnt = d.phys_port_cnt;
	a->max_msg_sz = p.max_msg_sz;
	a->port_state = p.state;
	a->max_mtu = p.max_mtu;
	a->active_mtu = p.active_mtu;
	a->gid_tbl_len = p.gid_tbl_len;
	a->link_layer = p.link_layer;
	return 0;
}

// shim_query_gid: 0 and the GID and its type; ENODATA (or another errno) for an empty entry.
static int shim_query_gid(struct ibv_context *ctx, int port, int idx, uint8_t *gid, int *type) {
	struct ibv_gid_entry e;
	int r = ibv_query_gid_ex(ctx, port, idx, &e, 0);
	if (r)
		return r;
	memcpy(gid, e.gid.raw, 16);
	*type = e.gid_type;
	return 0;
}

// ---- memory -------------------------------------------------------------------------------

static struct ibv_mr *shim_reg_mr(struct ibv_pd *pd, uint64_t addr, uint64_t len, int access) {
	return ibv_reg_mr(pd, (void *)(uintptr_t)addr, len, access);
}

// ---- completion queues --------------------------------------------------------------------

static struct ibv_cq *shim_create_cq(struct ibv_context *ctx, int n, struct ibv_comp_channel **chp) {
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!ch)
		return NULL;
	struct ibv_cq *cq = ibv_create_cq(ctx, n, NULL, ch, 0);
	if (!cq) {
		int e = errno;
		ibv_destroy_comp_channel(ch);
		errno = e;
		return NULL;
	}
	*chp = ch;
	return cq;
}

static int shim_destroy_cq(struct ibv_cq *cq, struct ibv_comp_channel *ch) {
	int r = ibv_destroy_cq(cq);
	if (r)
		return r;
	return ibv_destroy_comp_channel(ch);
}

struct shim_wc {
	uint64_t wr_id;
	uint32_t status, opcode, vendor_err, byte_len;
	uint32_t imm;       // host order; the invalidated rkey for IBV_WC_WITH_INV
	uint32_t qp_num, src_qp, wc_flags;
};

#define SHIM_POLL_MAX 64

// shim_poll polls up to max (≤ 64) completions in one ibv_poll_cq call and flattens them.
// inv_mask is the wc_flags bit(s) that mean "with invalidate": IBV_WC_WITH_INV, plus the
// kernel's IB_WC_WITH_INVALIDATE (1 << 2) on rxe, whose responder writes kernel ib_wc_flags
// into user-space CQEs.
static int shim_poll(struct ibv_cq *cq, struct shim_wc *out, int max, unsigned inv_mask) {
	struct ibv_wc wc[SHIM_POLL_MAX];
	if (max > SHIM_POLL_MAX)
		max = SHIM_POLL_MAX;
	int n = ibv_poll_cq(cq, max, wc);
	for (int i = 0; i < n; i++) {
		struct ibv_wc *w = &wc[i];
		struct shim_wc *o = &out[i];
		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->vendor_err = w->vendor_err;
		o->byte_len = w->byte_len;
		o->qp_num = w->qp_num;
		o->src_qp = w->src_qp;
		o->wc_flags = w->wc_flags;
		if (w->wc_flags & IBV_WC_WITH_IMM)
			o->imm = ntohl(w->imm_data);
		else if (w->wc_flags & inv_mask)
			o->imm = w->invalidated_rkey;
		else
			o->imm = 0;
	}
	return n;
}

// shim_arm_poll re-arms the CQ's notification and then polls once more: a completion that
// arrived before the re-arm is found here, one after it wakes the channel.
static int shim_arm_poll(struct ibv_cq *cq, struct shim_wc *out, int max, unsigned inv_mask) {
	int r = ibv_req_notify_cq(cq, 0);
	if (r)
		return -r;
	return shim_poll(cq, out, max, inv_mask);
}

// shim_wait_fd blocks until fd or stopfd is readable: 1 for fd, 0 for stopfd, -errno.
static int shim_wait_fd(int fd, int stopfd) {
	struct pollfd p[2] = {{fd, POLLIN, 0}, {stopfd, POLLIN, 0}};
	for (;;) {
		int r = poll(p, 2, -1);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (p[1].revents)
			return 0;
		if (p[0].revents)
			return 1;
	}
}

// shim_cq_wait waits for the channel's next event and acknowledges it: 1 event, 0 stop.
static int shim_cq_wait(struct ibv_comp_channel *ch, int stopfd) {
	int r = shim_wait_fd(ch->fd, stopfd);
	if (r <= 0)
		return r;
	struct ibv_cq *cq;
	void *cctx;
	if (ibv_get_cq_event(ch, &cq, &cctx))
		return -errno;
	ibv_ack_cq_events(cq, 1);
	return 1;
}

// ---- queue pairs --------------------------------------------------------------------------

struct shim_caps {
	uint32_t send_wr, recv_wr, send_sge, recv_sge, inline_data;
};

static struct ibv_qp *shim_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		struct shim_caps *c, int sigall) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = sigall;
	a.cap.max_send_wr = c->send_wr;
	a.cap.max_recv_wr = c->recv_wr;
	a.cap.max_send_sge = c->send_sge;
	a.cap.max_recv_sge = c->recv_sge;
	a.cap.max_inline_data = c->inline_data;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (!qp)
		return NULL;
	c->send_wr = a.cap.max_send_wr;
	c->recv_wr = a.cap.max_recv_wr;
	c->send_sge = a.cap.max_send_sge;
	c->recv_sge = a.cap.max_recv_sge;
	c->inline_data = a.cap.max_inline_data;
	return qp;
}

static uint32_t shim_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

struct shim_qpattr {
	uint32_t state, cur_state, access, pkey_index, port, path_mtu, timeout, retry_cnt, rnr_retry;
	uint32_t rq_psn, sq_psn, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, dest_qpn;
	uint32_t sgid_index, hop_limit, traffic_class, flow_label;
	uint8_t dgid[16];
};

static int shim_modify_qp(struct ibv_qp *qp, struct shim_qpattr *s, int mask) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = s->state;
	a.cur_qp_state = s->cur_state;
	a.qp_access_flags = s->access;
	a.pkey_index = s->pkey_index;
	a.port_num = s->port;
	a.path_mtu = s->path_mtu;
	a.timeout = s->timeout;
	a.retry_cnt = s->retry_cnt;
	a.rnr_retry = s->rnr_retry;
	a.rq_psn = s->rq_psn;
	a.sq_psn = s->sq_psn;
	a.max_rd_atomic = s->max_rd_atomic;
	a.max_dest_rd_atomic = s->max_dest_rd_atomic;
	a.min_rnr_timer = s->min_rnr_timer;
	a.dest_qp_num = s->dest_qpn;
	if (mask & IBV_QP_AV) {
		a.ah_attr.is_global = 1;
		a.ah_attr.port_num = s->port;
		a.ah_attr.grh.sgid_index = s->sgid_index;
		a.ah_attr.grh.hop_limit = s->hop_limit;
		a.ah_attr.grh.traffic_class = s->traffic_class;
		a.ah_attr.grh.flow_label = s->flow_label;
		memcpy(a.ah_attr.grh.dgid.raw, s->dgid, 16);
	}
	return ibv_modify_qp(qp, &a, mask);
}

static int shim_query_qp(struct ibv_qp *qp, struct shim_qpattr *s, struct shim_caps *c, int mask) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	memset(&a, 0, sizeof a);
	memset(&i, 0, sizeof i);
	int r = ibv_query_qp(qp, &a, mask, &i);
	if (r)
		return r;
	s->state = a.qp_state;
	s->cur_state = a.cur_qp_state;
	s->access = a.qp_access_flags;
	s->pkey_index = a.pkey_index;
	s->port = a.port_num;
	s->path_mtu = a.path_mtu;
	s->timeout = a.timeout;
	s->retry_cnt = a.retry_cnt;
	s->rnr_retry = a.rnr_retry;
	s->rq_psn = a.rq_psn;
	s->sq_psn = a.sq_psn;
	s->max_rd_atomic = a.max_rd_atomic;
	s->max_dest_rd_atomic = a.max_dest_rd_atomic;
	s->min_rnr_timer = a.min_rnr_timer;
	s->dest_qpn = a.dest_qp_num;
	s->sgid_index = a.ah_attr.grh.sgid_index;
	s->hop_limit = a.ah_attr.grh.hop_limit;
	s->traffic_class = a.ah_attr.grh.traffic_class;
	s->flow_label = a.ah_attr.grh.flow_label;
	memcpy(s->dgid, a.ah_attr.grh.dgid.raw, 16);
	if (c) {
		c->send_wr = i.cap.max_send_wr;
		c->recv_wr = i.cap.max_recv_wr;
		c->send_sge = i.cap.max_send_sge;
		c->recv_sge = i.cap.max_recv_sge;
		c->inline_data = i.cap.max_inline_data;
	}
	return 0;
}

// A send work request, flat. For IBV_WR_BIND_MW: remote_addr/length/access describe the window
// over mr, rkey is the new key and cur_rkey the key the window has when this WR executes.
struct shim_wr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t length;
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint32_t rkey;
	uint32_t imm;        // host order: immediate data or the rkey to invalidate
	uint32_t sge_off;
	uint32_t num_sge;
	uint32_t opcode;
	uint32_t flags;
	uint32_t access;
	uint32_t cur_rkey;
};

static int shim_post_segment(struct ibv_qp *qp, struct ibv_send_wr *scratch, int start, int end, int *bad) {
	if (end <= start)
		return 0;
	for (int k = start; k < end; k++)
		scratch[k].next = (k + 1 < end) ? &scratch[k + 1] : NULL;
	struct ibv_send_wr *badwr = NULL;
	int r = ibv_post_send(qp, &scratch[start], &badwr);
	if (r)
		*bad = badwr ? (int)(badwr - scratch) : start;
	return r;
}

// shim_post_send posts n WRs (built in scratch), in one ibv_post_send unless a bind needs the
// window's ibv_mw.rkey changed first: providers take the window's identity from ibv_mw.rkey
// when the WR is posted, and the kernel checks it against the key the window has when the bind
// executes, so a chain that binds one window twice is posted in segments. On success every
// bound window's ibv_mw.rkey is its newest key. *bad is the index of the refused WR (-1).
static int shim_post_send(struct ibv_qp *qp, struct shim_wr *w, int n, struct ibv_sge *sges,
		struct ibv_send_wr *scratch, int *bad) {
	*bad = -1;
	if (n == 0)
		return 0;
	int start = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *s = &scratch[i];
		memset(s, 0, sizeof *s);
		s->wr_id = w[i].wr_id;
		s->sg_list = w[i].num_sge ? &sges[w[i].sge_off] : NULL;
		s->num_sge = w[i].num_sge;
		s->opcode = w[i].opcode;
		s->send_flags = w[i].flags;
		switch (w[i].opcode) {
		case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			s->imm_data = htonl(w[i].imm);
			break;
		case IBV_WR_SEND_WITH_INV:
		case IBV_WR_LOCAL_INV:
			s->invalidate_rkey = w[i].imm;
			break;
		default:
			break;
		}
		switch (w[i].opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			s->wr.rdma.remote_addr = w[i].remote_addr;
			s->wr.rdma.rkey = w[i].rkey;
			break;
		case IBV_WR_BIND_MW:
			s->bind_mw.mw = w[i].mw;
			s->bind_mw.rkey = w[i].rkey;
			s->bind_mw.bind_info.mr = w[i].mr;
			s->bind_mw.bind_info.addr = w[i].remote_addr;
			s->bind_mw.bind_info.length = w[i].length;
			s->bind_mw.bind_info.mw_access_flags = w[i].access;
			if (w[i].mw->rkey != w[i].cur_rkey) {
				int r = shim_post_segment(qp, scratch, start, i, bad);
				if (r)
					return r;
				w[i].mw->rkey = w[i].cur_rkey;
				start = i;
			}
			break;
		default:
			break;
		}
	}
	int r = shim_post_segment(qp, scratch, start, n, bad);
	if (r)
		return r;
	for (int i = 0; i < n; i++)
		if (w[i].opcode == IBV_WR_BIND_MW)
			w[i].mw->rkey = w[i].rkey;
	return 0;
}

static int shim_post_recv(struct ibv_qp *qp, uint64_t *ids, uint32_t *sge_off, uint32_t *num_sge,
		int n, struct ibv_sge *sges, struct ibv_recv_wr *scratch, int *bad) {
	*bad = -1;
	if (n == 0)
		return 0;
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr *r = &scratch[i];
		r->wr_id = ids[i];
		r->next = (i + 1 < n) ? &scratch[i + 1] : NULL;
		r->sg_list = num_sge[i] ? &sges[sge_off[i]] : NULL;
		r->num_sge = num_sge[i];
	}
	struct ibv_recv_wr *badwr = NULL;
	int r = ibv_post_recv(qp, scratch, &badwr);
	if (r && badwr)
		*bad = (int)(badwr - scratch);
	return r;
}

// ---- async events -------------------------------------------------------------------------

// shim_async_get: 1 and the event (type, QP number or -1), 0 on stop, -errno.
static int shim_async_get(struct ibv_context *ctx, int stopfd, int *type, int64_t *qpn) {
	int r = shim_wait_fd(ctx->async_fd, stopfd);
	if (r <= 0)
		return r;
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return -errno;
	*type = ev.event_type;
	*qpn = -1;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		*qpn = ev.element.qp->qp_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 1;
}

// ---- connection management (librdmacm) ----------------------------------------------------

struct shim_addr {
	int32_t family;      // AF_INET or AF_INET6
	uint16_t port;
	uint8_t addr[16];    // IPv4 in the first 4 bytes
};

static void shim_from_sockaddr(struct sockaddr *sa, struct shim_addr *a) {
	memset(a, 0, sizeof *a);
	if (!sa)
		return;
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;
		a->family = AF_INET;
		a->port = ntohs(in->sin_port);
		memcpy(a->addr, &in->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
		a->family = AF_INET6;
		a->port = ntohs(in6->sin6_port);
		memcpy(a->addr, &in6->sin6_addr, 16);
	}
}

static socklen_t shim_to_sockaddr(struct shim_addr *a, struct sockaddr_storage *ss) {
	memset(ss, 0, sizeof *ss);
	if (a->family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(a->port);
		memcpy(&in->sin_addr, a->addr, 4);
		return sizeof *in;
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(a->port);
	memcpy(&in6->sin6_addr, a->addr, 16);
	return sizeof *in6;
}

static struct rdma_cm_id *shim_cm_create_id(struct rdma_event_channel *ch, uint64_t handle) {
	struct rdma_cm_id *id = NULL;
	if (rdma_create_id(ch, &id, (void *)(uintptr_t)handle, RDMA_PS_TCP))
		return NULL;
	return id;
}

static void shim_cm_set_handle(struct rdma_cm_id *id, uint64_t handle) { id->context = (void *)(uintptr_t)handle; }

static int shim_cm_listen(struct rdma_cm_id *id, struct shim_addr *a, int backlog) {
	struct sockaddr_storage ss;
	shim_to_sockaddr(a, &ss);
	if (rdma_bind_addr(id, (struct sockaddr *)&ss))
		return -errno;
	if (rdma_listen(id, backlog))
		return -errno;
	return 0;
}

static int shim_cm_resolve_addr(struct rdma_cm_id *id, struct shim_addr *src, struct shim_addr *dst, int timeout_ms) {
	struct sockaddr_storage s, d;
	shim_to_sockaddr(dst, &d);
	struct sockaddr *sp = NULL;
	if (src && src->family) {
		shim_to_sockaddr(src, &s);
		sp = (struct sockaddr *)&s;
	}
	if (rdma_resolve_addr(id, sp, (struct sockaddr *)&d, timeout_ms))
		return -errno;
	return 0;
}

struct shim_connparam {
	uint32_t qp_num;
	uint8_t responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq;
	uint8_t pd_len;
	uint8_t pd[255];
};

static void shim_fill_param(struct rdma_conn_param *p, struct shim_connparam *s) {
	memset(p, 0, sizeof *p);
	p->private_data = s->pd_len ? s->pd : NULL;
	p->private_data_len = s->pd_len;
	p->responder_resources = s->responder_resources;
	p->initiator_depth = s->initiator_depth;
	p->flow_control = s->flow_control;
	p->retry_count = s->retry_count;
	p->rnr_retry_count = s->rnr_retry_count;
	p->srq = s->srq;
	p->qp_num = s->qp_num;
}

static int shim_cm_connect(struct rdma_cm_id *id, struct shim_connparam *s) {
	struct rdma_conn_param p;
	shim_fill_param(&p, s);
	return rdma_connect(id, &p) ? -errno : 0;
}

static int shim_cm_accept(struct rdma_cm_id *id, struct shim_connparam *s) {
	struct rdma_conn_param p;
	shim_fill_param(&p, s);
	return rdma_accept(id, &p) ? -errno : 0;
}

static int shim_cm_reject(struct rdma_cm_id *id, uint8_t *pd, int len) {
	return rdma_reject(id, len ? pd : NULL, len) ? -errno : 0;
}

static struct ibv_context *shim_cm_verbs(struct rdma_cm_id *id) { return id->verbs; }

// shim_cm_modify moves qp to state with the attributes rdma_cm derives for id (INIT, RTR,
// RTS), overriding max_dest_rd_atomic (RTR) / max_rd_atomic (RTS) when the override is ≥ 0.
static int shim_cm_modify(struct rdma_cm_id *id, struct ibv_qp *qp, int state, int rd_override) {
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -errno;
	if (rd_override >= 0) {
		if (state == IBV_QPS_RTR)
			a.max_dest_rd_atomic = rd_override;
		else if (state == IBV_QPS_RTS)
			a.max_rd_atomic = rd_override;
	}
	int r = ibv_modify_qp(qp, &a, mask);
	return r ? -r : 0;
}

struct shim_cmev {
	int32_t event, status;
	uint64_t handle, listen_handle;
	struct rdma_cm_id *id;
	struct shim_addr local, peer;
	uint32_t qp_num;
	uint8_t responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq;
	uint8_t pd_len;
	int32_t path_mtu;
	uint8_t pd[256];
};

// shim_cm_get waits for the next CM event, copies what we need and acknowledges it:
// 1 event, 0 stop, -errno.
static int shim_cm_get(struct rdma_event_channel *ch, int stopfd, struct shim_cmev *o) {
	int r = shim_wait_fd(ch->fd, stopfd);
	if (r <= 0)
		return r;
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return -errno;
	memset(o, 0, sizeof *o);
	o->event = ev->event;
	o->status = ev->status;
	o->id = ev->id;
	o->handle = (uint64_t)(uintptr_t)ev->id->context;
	if (ev->listen_id)
		o->listen_handle = (uint64_t)(uintptr_t)ev->listen_id->context;
	shim_from_sockaddr(rdma_get_local_addr(ev->id), &o->local);
	shim_from_sockaddr(rdma_get_peer_addr(ev->id), &o->peer);
	o->path_mtu = (ev->id->route.num_paths > 0 && ev->id->route.path_rec) ? ev->id->route.path_rec->mtu : 0;
	struct rdma_conn_param *c = &ev->param.conn;
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
	case RDMA_CM_EVENT_ESTABLISHED:
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_DISCONNECTED:
		o->qp_num = c->qp_num;
		o->responder_resources = c->responder_resources;
		o->initiator_depth = c->initiator_depth;
		o->flow_control = c->flow_control;
		o->retry_count = c->retry_count;
		o->rnr_retry_count = c->rnr_retry_count;
		o->srq = c->srq;
		if (c->private_data && c->private_data_len) {
			int l = c->private_data_len > 255 ? 255 : c->private_data_len;
			memcpy(o->pd, c->private_data, l);
			o->pd_len = l;
		}
		break;
	default:
		break;
	}
	rdma_ack_cm_event(ev);
	return 1;
}

#endif
