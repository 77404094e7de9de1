// Package srp encodes and decodes the information units (IUs) of the SCSI
// RDMA Protocol (SRP, T10 draft rev. 16a plus the SRP-2 immediate-data
// extension) as carried by Linux ib_srp / ib_srpt.
//
// # Conventions
//
//   - Every multi-byte field is big-endian, except the 8-byte tag. The tag is
//     opaque: it is kept as raw bytes (Tag) and echoed byte for byte, never
//     byte-swapped. (Linux stores a host-order u64 in it.)
//   - Each IU is a typed view over a byte slice in the style of gVisor's
//     pkg/tcpip/header: Cmd, Rsp, TskMgmt, LoginRsp, LoginRej, ILogout,
//     TLogout, CredReq, CredRsp, AerReq and AerRsp are all []byte. A
//     ParseXxx function validates a received IU and returns the view;
//     accessors on a view returned by ParseXxx never panic. Accessors on an
//     unvalidated view may panic, like slice indexing.
//   - Each view has an XxxFields value struct and an Encode method that
//     writes the IU into the view's own bytes (the caller's buffer), clears
//     the reserved bytes and returns the IU length. Fields returns the
//     decoded value; variable-length parts (CDB, descriptor lists, sense and
//     response data, immediate data) alias the IU instead of being copied.
//   - SRP_LOGIN_REQ has two wire forms, the 64-byte IB CM form and Linux's
//     56-byte struct srp_login_req_rdma used as RDMA CM private data; both
//     decode to and encode from the one value type LoginReq.
//   - Parsing accepts buffers longer than the IU (a receive buffer, CM
//     private data padded to its maximum) and the returned view is cut to the
//     IU's own length. Reserved fields are ignored on input and zeroed on
//     output.
//   - Decoding and encoding do not allocate on the success path. Failures
//     are reported as *ParseError (decoding) or *EncodeError (encoding),
//     both wrapping one of the sentinel errors (ErrTruncated, ErrBadOpcode,
//     ...) for errors.Is.
//
// Layouts and constants follow torvalds/linux:include/scsi/srp.h; behaviour
// notes refer to drivers/infiniband/ulp/srp/ib_srp.c (initiator) and
// drivers/infiniband/ulp/srpt/ib_srpt.c (target).
//
// The package does no I/O, keeps no global mutable state and does not log.
package srp
