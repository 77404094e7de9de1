package config

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds a configuration file.
const MaxFileSize = 16 << 20

// Load reads, parses, defaults and validates the configuration file at path. Errors about the
// content are an ErrorList naming path, the line and the field of every problem; an unreadable
// file gives the *os.PathError (errors.Is(err, fs.ErrNotExist) holds for a missing file).
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, ErrorList{{File: path, Err: ErrInvalid, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}}
	}
	return Parse(path, data)
}

// Parse decodes data strictly (unknown fields are errors), applies the defaults and validates.
// name is the file name errors are reported against. An empty document is the empty
// configuration (every default, no transports, targets or sessions).
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, func(c *Config, src *source) { c.src = src }, (*validator).config)
}

// ParseTarget decodes one target (the YAML of one targets: entry, or its JSON) strictly,
// applies the defaults and validates it on its own, as for `srpctl target create -f`.
func ParseTarget(name string, data []byte) (*Target, error) {
	return parse(name, data, nil, func(v *validator, t *Target) { v.target("", t) })
}

// ParseSession decodes one session (a sessions: entry) like ParseTarget.
func ParseSession(name string, data []byte) (*Session, error) {
	return parse(name, data, nil, func(v *validator, s *Session) { v.session("", s) })
}

// parse decodes data strictly into a new T, gives it the decoder's source map (keep, when
// set), applies T's defaults and validates it with check; every error, sorted.
func parse[T any, PT interface {
	*T
	SetDefaults()
}](name string, data []byte, keep func(PT, *source), check func(*validator, PT)) (PT, error) {
	x := PT(new(T))
	src, errs := decodeInto(name, data, x)
	if keep != nil {
		keep(x, src)
	}
	x.SetDefaults()
	v := &validator{src: src}
	check(v, x)
	for _, e := range errs {
		// Decoding errors are found before the objects' names are known; name them now.
		e.Object, e.Field = v.object(e.Path)
	}
	if errs = append(errs, v.errs...); len(errs) > 0 {
		return nil, errs.sorted()
	}
	return x, nil
}

// Marshal encodes the configuration as YAML, defaults applied (on a copy), so every setting is
// explicit. Parse(Marshal(c)) equals c for a valid, defaulted c. Comments of the file c came
// from are not preserved.
func Marshal(c *Config) ([]byte, error) {
	cp := c.Clone()
	cp.SetDefaults()
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(cp); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b.Bytes(), nil
}

// Save marshals c and writes it to path with AtomicWrite.
func Save(path string, c *Config, perm os.FileMode) error {
	data, err := Marshal(c)
	if err != nil {
		return err
	}
	return AtomicWrite(path, data, perm)
}

// AtomicWrite replaces path with data so that a crash leaves either the old or the new file,
// never a mix: it writes a temporary file in the same directory, fsyncs it, renames it over
// path and fsyncs the directory. An existing file's mode and owner are kept (perm applies to a
// new file).
func AtomicWrite(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if fi, err := os.Stat(path); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("config: write %s: not a regular file", path)
		}
		perm = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("config: write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("config: chmod %s: %w", tmp.Name(), err)
	}
	if err = keepOwner(tmp, path); err != nil {
		return fmt.Errorf("config: chown %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("config: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("config: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("config: rename %s: %w", tmp.Name(), err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("config: fsync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("config: fsync directory %s: %w", dir, err)
	}
	return nil
}

// Clone returns a deep copy of c (without its source positions: a clone validates without
// line numbers).
func (c *Config) Clone() *Config {
	cp := deepCopy(*c)
	cp.src = nil
	return &cp
}

// Clone returns a deep copy of t.
func (t *Target) Clone() *Target { cp := deepCopy(*t); return &cp }

// Clone returns a deep copy of s.
func (s *Session) Clone() *Session { cp := deepCopy(*s); return &cp }

// Equal reports whether a and b hold the same settings (where they were parsed from aside).
func Equal(a, b *Config) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.src, y.src = nil, nil
	return reflect.DeepEqual(x, y)
}

func deepCopy[T any](v T) T {
	var out T
	copyValue(reflect.ValueOf(&out).Elem(), reflect.ValueOf(v))
	return out
}

// copyValue copies src into dst, duplicating what pointers and slices refer to. Unexported
// struct fields are copied by the whole-struct assignment; the only unexported pointer (Config's
// source) is dropped by Clone.
func copyValue(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Pointer:
		if src.IsNil() {
			return
		}
		n := reflect.New(src.Type().Elem())
		copyValue(n.Elem(), src.Elem())
		dst.Set(n)
	case reflect.Slice:
		if src.IsNil() {
			return
		}
		s := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		for i := range src.Len() {
			copyValue(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	case reflect.Struct:
		dst.Set(src)
		for i := range src.NumField() {
			if src.Type().Field(i).IsExported() {
				copyValue(dst.Field(i), src.Field(i))
			}
		}
	default:
		dst.Set(src)
	}
}
