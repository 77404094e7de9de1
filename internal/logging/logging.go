// Package logging builds the zap loggers of srpd's commands (the daemon's JSON/console choice
// from its config comes here too once the daemon is wired).
package logging

import (
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Console returns a human-readable logger writing to w: info level, or debug when debug is set,
// with microsecond wall-clock timestamps.
func Console(w io.Writer, debug bool) *zap.Logger {
	level := zapcore.InfoLevel
	if debug {
		level = zapcore.DebugLevel
	}
	ec := zap.NewDevelopmentEncoderConfig()
	ec.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000000")
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), level))
}
