// Package logging builds the zap loggers of srpd's commands: the daemon's JSON or console logs
// (New, from logging: in srpd.yaml and the --log-format/--log-level flags) and the console
// logger of the standalone tools (Console).
package logging

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// Formats accepted by New.
const (
	FormatJSON    = "json"
	FormatConsole = "console"
	// FormatAuto is console when the output is a terminal, json otherwise (a service manager,
	// a pipe, a file): humans get readable lines, log collectors get structured ones.
	FormatAuto = "auto"
)

// Console returns a human-readable logger writing to w: info level, or debug when debug is set,
// with microsecond wall-clock timestamps.
func Console(w io.Writer, debug bool) *zap.Logger {
	level := zapcore.InfoLevel
	if debug {
		level = zapcore.DebugLevel
	}
	return zap.New(consoleCore(w, zap.NewAtomicLevelAt(level)))
}

func consoleCore(w io.Writer, level zapcore.LevelEnabler) zapcore.Core {
	ec := zap.NewDevelopmentEncoderConfig()
	ec.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000000")
	return zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), level)
}

// ParseLevel parses debug, info, warn or error.
func ParseLevel(s string) (zapcore.Level, error) {
	switch s {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "warn":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}

// IsTerminal reports whether w is a terminal (a *os.File on a tty).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// ResolveFormat turns FormatAuto into json or console for w; other formats are returned as
// they are, or an error for an unknown one.
func ResolveFormat(format string, w io.Writer) (string, error) {
	switch format {
	case FormatJSON, FormatConsole:
		return format, nil
	case FormatAuto, "":
		if IsTerminal(w) {
			return FormatConsole, nil
		}
		return FormatJSON, nil
	}
	return "", fmt.Errorf("log format %q: want json, console or auto", format)
}

// New returns the daemon's logger writing to w in format (json, console or auto) at the level
// held by level, which the caller may change later (a reload of logging.level). JSON lines
// carry ts (RFC 3339 with nanoseconds), level, logger, msg, caller and the fields; console
// lines are for people.
func New(w io.Writer, format string, level zap.AtomicLevel) (*zap.Logger, error) {
	f, err := ResolveFormat(format, w)
	if err != nil {
		return nil, err
	}
	if f == FormatConsole {
		return zap.New(consoleCore(w, level)), nil
	}
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "ts"
	ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), level)
	return zap.New(core, zap.AddCaller()), nil
}
