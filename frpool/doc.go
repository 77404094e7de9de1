// Package frpool is the fast-registration MR pool, one per QP, with rkey increment and
// invalidate ordering that are correct by construction, plus RDMA read/write contexts that
// hide MRs from the ULP.
package frpool
