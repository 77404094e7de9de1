package nbd

// Wire constants of the NBD protocol. Every value is from NetworkBlockDevice/nbd:doc/proto.md
// (the section is named next to each group); all integers on the wire are big-endian.

// Handshake magics (proto.md "Newstyle negotiation", "Fixed newstyle negotiation").
const (
	nbdMagic       = 0x4e42444d41474943 // "NBDMAGIC", INIT_PASSWD
	optMagic       = 0x49484156454F5054 // "IHAVEOPT"; sent by the server, then before every option
	optReplyMagic  = 0x0003e889045565a9 // fixed newstyle option reply magic
	zeroPadLen     = 124                // reserved zeroes after NBD_OPT_EXPORT_NAME unless NO_ZEROES
	optHeaderLen   = 16                 // IHAVEOPT(8) option(4) length(4)
	optReplyHdrLen = 20                 // magic(8) option(4) type(4) length(4)
)

// Handshake flags, sent by the server (proto.md "Handshake flags").
const (
	flagFixedNewstyle uint16 = 1 << 0 // NBD_FLAG_FIXED_NEWSTYLE
	flagNoZeroes      uint16 = 1 << 1 // NBD_FLAG_NO_ZEROES
)

// Client flags (proto.md "Client flags"). Any other bit makes the server drop the connection.
const (
	clientFlagFixedNewstyle uint32 = 1 << 0 // NBD_FLAG_C_FIXED_NEWSTYLE
	clientFlagNoZeroes      uint32 = 1 << 1 // NBD_FLAG_C_NO_ZEROES
	clientFlagsKnown               = clientFlagFixedNewstyle | clientFlagNoZeroes
)

// Transmission flags (proto.md "Transmission flags").
const (
	tflagHasFlags        uint16 = 1 << 0  // NBD_FLAG_HAS_FLAGS: always set
	tflagReadOnly        uint16 = 1 << 1  // NBD_FLAG_READ_ONLY
	tflagSendFlush       uint16 = 1 << 2  // NBD_FLAG_SEND_FLUSH
	tflagSendFUA         uint16 = 1 << 3  // NBD_FLAG_SEND_FUA
	tflagRotational      uint16 = 1 << 4  // NBD_FLAG_ROTATIONAL (never set)
	tflagSendTrim        uint16 = 1 << 5  // NBD_FLAG_SEND_TRIM
	tflagSendWriteZeroes uint16 = 1 << 6  // NBD_FLAG_SEND_WRITE_ZEROES (with NBD_CMD_FLAG_NO_HOLE)
	tflagSendDF          uint16 = 1 << 7  // NBD_FLAG_SEND_DF: only once structured replies are on
	tflagCanMultiConn    uint16 = 1 << 8  // NBD_FLAG_CAN_MULTI_CONN
	tflagSendCache       uint16 = 1 << 10 // NBD_FLAG_SEND_CACHE
)

// Option types (proto.md "Option types").
const (
	optExportName      uint32 = 1  // NBD_OPT_EXPORT_NAME
	optAbort           uint32 = 2  // NBD_OPT_ABORT
	optList            uint32 = 3  // NBD_OPT_LIST
	optStartTLS        uint32 = 5  // NBD_OPT_STARTTLS
	optInfo            uint32 = 6  // NBD_OPT_INFO
	optGo              uint32 = 7  // NBD_OPT_GO
	optStructuredReply uint32 = 8  // NBD_OPT_STRUCTURED_REPLY
	optListMetaContext uint32 = 9  // NBD_OPT_LIST_META_CONTEXT
	optSetMetaContext  uint32 = 10 // NBD_OPT_SET_META_CONTEXT
)

// Option reply types (proto.md "Option reply types"). Errors have bit 31 set.
const (
	repAck         uint32 = 1         // NBD_REP_ACK
	repServer      uint32 = 2         // NBD_REP_SERVER
	repInfo        uint32 = 3         // NBD_REP_INFO
	repMetaContext uint32 = 4         // NBD_REP_META_CONTEXT: context ID(4), name
	repErrUnsup    uint32 = 1<<31 + 1 // NBD_REP_ERR_UNSUP
	repErrPolicy   uint32 = 1<<31 + 2 // NBD_REP_ERR_POLICY
	repErrInvalid  uint32 = 1<<31 + 3 // NBD_REP_ERR_INVALID
	repErrUnknown  uint32 = 1<<31 + 6 // NBD_REP_ERR_UNKNOWN
	repErrShutdown uint32 = 1<<31 + 7 // NBD_REP_ERR_SHUTDOWN
	repErrTooBig   uint32 = 1<<31 + 9 // NBD_REP_ERR_TOO_BIG
	repErrBit      uint32 = 1 << 31   // set in every error reply type
)

// NBD_REP_INFO information types (proto.md "NBD_REP_INFO").
const (
	infoExport      uint16 = 0 // NBD_INFO_EXPORT: size(8) transmission flags(2); length 12
	infoName        uint16 = 1 // NBD_INFO_NAME
	infoDescription uint16 = 2 // NBD_INFO_DESCRIPTION
	infoBlockSize   uint16 = 3 // NBD_INFO_BLOCK_SIZE: minimum, preferred, maximum (4 each); length 14
)

// Request and reply magics (proto.md "Request message", "Simple reply message", "Structured
// reply chunk message").
const (
	requestMagic         = 0x25609513 // NBD_REQUEST_MAGIC
	simpleReplyMagic     = 0x67446698 // NBD_SIMPLE_REPLY_MAGIC
	structuredReplyMagic = 0x668e33ef // NBD_STRUCTURED_REPLY_MAGIC

	requestHdrLen    = 28 // magic(4) flags(2) type(2) handle(8) offset(8) length(4)
	simpleReplyLen   = 16 // magic(4) error(4) handle(8)
	structuredHdrLen = 20 // magic(4) flags(2) type(2) handle(8) length(4)
	offsetDataHdrLen = structuredHdrLen + 8
	errorChunkHdrLen = structuredHdrLen + 6 // + error(4) message length(2)
	maxErrorMessage  = 256                  // we send at most this much text in an error chunk
	maxStringLen     = 4096                 // proto.md "Conventions": strings MUST be no longer
	replyHeadroom    = 32                   // bytes kept in front of every data buffer for a reply header
)

// Command types (proto.md "Request types").
const (
	cmdRead        uint16 = 0 // NBD_CMD_READ
	cmdWrite       uint16 = 1 // NBD_CMD_WRITE
	cmdDisc        uint16 = 2 // NBD_CMD_DISC
	cmdFlush       uint16 = 3 // NBD_CMD_FLUSH
	cmdTrim        uint16 = 4 // NBD_CMD_TRIM
	cmdCache       uint16 = 5 // NBD_CMD_CACHE
	cmdWriteZeroes uint16 = 6 // NBD_CMD_WRITE_ZEROES
	cmdBlockStatus uint16 = 7 // NBD_CMD_BLOCK_STATUS (EINVAL unless base:allocation was set)
)

// Command flags (proto.md "Command flags").
const (
	cmdFlagFUA      uint16 = 1 << 0 // NBD_CMD_FLAG_FUA: valid on every command
	cmdFlagNoHole   uint16 = 1 << 1 // NBD_CMD_FLAG_NO_HOLE: NBD_CMD_WRITE_ZEROES
	cmdFlagDF       uint16 = 1 << 2 // NBD_CMD_FLAG_DF: NBD_CMD_READ with structured replies
	cmdFlagReqOne   uint16 = 1 << 3 // NBD_CMD_FLAG_REQ_ONE: NBD_CMD_BLOCK_STATUS
	cmdFlagFastZero uint16 = 1 << 4 // NBD_CMD_FLAG_FAST_ZERO: not advertised, so EINVAL
)

// Structured reply flags and chunk types (proto.md "Structured reply flags", "Structured reply
// types").
const (
	replyFlagDone        uint16 = 1 << 0    // NBD_REPLY_FLAG_DONE
	replyTypeNone        uint16 = 0         // NBD_REPLY_TYPE_NONE
	replyTypeOffsetData  uint16 = 1         // NBD_REPLY_TYPE_OFFSET_DATA
	replyTypeBlockStatus uint16 = 5         // NBD_REPLY_TYPE_BLOCK_STATUS: context ID(4), descriptors
	replyTypeError       uint16 = 1<<15 + 1 // NBD_REPLY_TYPE_ERROR
	replyTypeErrorOffset uint16 = 1<<15 + 2 // NBD_REPLY_TYPE_ERROR_OFFSET (not sent)
)

// Metadata contexts (proto.md "Metadata querying", "Metadata contexts"). base:allocation is the
// only one served.
const (
	metaBaseAllocation = "base:allocation"
	metaBaseNamespace  = "base:"
	// metaAllocationID is the context ID NBD_OPT_SET_META_CONTEXT gives base:allocation; any
	// value is allowed, NBD_OPT_LIST_META_CONTEXT replies carry 0 (proto.md: reserved).
	metaAllocationID uint32 = 1
	stateHole        uint32 = 1 << 0 // NBD_STATE_HOLE
	stateZero        uint32 = 1 << 1 // NBD_STATE_ZERO
	// blockStatusHdrLen is a NBD_REPLY_TYPE_BLOCK_STATUS chunk before its descriptors.
	blockStatusHdrLen = structuredHdrLen + 4
	// extentDescLen is one block descriptor: length(4) status flags(4).
	extentDescLen = 8
	// maxExtents is how many descriptors fit a request's scratch reply buffer; proto.md lets
	// the server answer with fewer descriptors than would cover the request.
	maxExtents = (errorChunkHdrLen + maxErrorMessage - blockStatusHdrLen) / extentDescLen
)

// cmdName names a command type for logs and error messages.
func cmdName(t uint16) string {
	switch t {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdCache:
		return "CACHE"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	case cmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "unknown"
}
