// Package initiator is the SRP initiator: sessions, channels, request table, credits, reconnect,
// a block API per LUN and NBD exports. It turns SCSI requests into SRP IUs over the transport API.
package initiator
