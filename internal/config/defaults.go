package config

import (
	"cmp"
	"strings"
)

// SetDefaults fills every omitted (zero) field with its default, in place, so that the config
// (and what Marshal writes) states every setting explicitly. It is idempotent. Parse and Load
// call it; call it yourself on a Config built in code before Validate.
func (c *Config) SetDefaults() {
	nilIfEmpty(&c.Transports)
	nilIfEmpty(&c.Targets)
	nilIfEmpty(&c.Sessions)
	nilIfEmpty(&c.AllowedPaths)
	c.Version = cmp.Or(c.Version, DefaultVersion)
	for i := range c.Transports {
		c.Transports[i].SetDefaults()
	}
	single := ""
	if len(c.Transports) == 1 {
		single = c.Transports[0].Name
	}
	for i := range c.Targets {
		t := &c.Targets[i]
		if t.Transport == "" {
			t.Transport = single
		}
		t.SetDefaults()
	}
	for i := range c.Sessions {
		s := &c.Sessions[i]
		if s.Transport == "" {
			s.Transport = single
		}
		s.SetDefaults()
	}
	if c.Control.Socket == "" {
		c.Control.Socket = DefaultControlSocket
	}
	c.Control.Mode = cmp.Or(c.Control.Mode, DefaultControlMode)
	if c.Logging.Level == "" {
		c.Logging.Level = DefaultLogLevel
	}
	if c.Logging.Format == "" {
		c.Logging.Format = DefaultLogFormat
	}
}

// SetDefaults fills the transport's omitted fields. "verbs:<ibdev>" in Driver is split into
// Driver and Device.
func (t *Transport) SetDefaults() {
	if dev, ok := strings.CutPrefix(t.Driver, DriverVerbs+":"); ok && t.Device == "" {
		t.Driver, t.Device = DriverVerbs, dev
	}
	if t.Driver == "" {
		t.Driver = DefaultDriver
	}
	switch t.Driver {
	case DriverSoftRoCE:
		t.UDPPort = cmp.Or(t.UDPPort, DefaultUDPPort)
		t.SocketBuffer = cmp.Or(t.SocketBuffer, DefaultSocketBuffer)
		t.MTU = cmp.Or(t.MTU, DefaultSoftRoCEMTU)
	case DriverVerbs:
		t.Port = cmp.Or(t.Port, DefaultVerbsPort)
	}
}

// SetDefaults fills the target's omitted fields (not Transport, which depends on the Config).
func (t *Target) SetDefaults() {
	nilIfEmpty(&t.Listen)
	nilIfEmpty(&t.LUNs)
	nilIfEmpty(&t.ACLs)
	for i := range t.ACLs {
		nilIfEmpty(&t.ACLs[i].LUNs)
	}
	t.CMPort = cmp.Or(t.CMPort, DefaultCMPort)
	for i := range t.LUNs {
		t.LUNs[i].SetDefaults()
	}
	t.Limits.SetDefaults()
}

// SetDefaults fills the LUN's omitted fields.
func (l *LUN) SetDefaults() {
	l.BlockSize = cmp.Or(l.BlockSize, DefaultBlockSize)
	if l.RBD != nil {
		l.RBD.ClusterConfig = cmp.Or(l.RBD.ClusterConfig, DefaultRBDClusterConfig)
		l.RBD.Client = cmp.Or(l.RBD.Client, DefaultRBDClient)
		l.RBD.ExclusiveLock = cmp.Or(l.RBD.ExclusiveLock, RBDLockManaged)
	}
}

// SetDefaults fills the omitted limits.
func (l *Limits) SetDefaults() {
	l.MaxChannels = cmp.Or(l.MaxChannels, DefaultMaxChannels)
	l.QueueDepth = cmp.Or(l.QueueDepth, DefaultTargetQueueDepth)
	l.MaxITIULen = cmp.Or(l.MaxITIULen, DefaultMaxITIULen)
	l.MaxTIIULen = cmp.Or(l.MaxTIIULen, DefaultMaxTIIULen)
	if l.ImmediateData == nil {
		l.ImmediateData = Bool(true)
	}
}

// SetDefaults fills the session's omitted fields (not Transport, which depends on the Config).
func (s *Session) SetDefaults() {
	nilIfEmpty(&s.NBD)
	for i := range s.NBD {
		s.NBD[i].SetDefaults()
	}
	s.Port = cmp.Or(s.Port, DefaultSessionPort)
	s.ChCount = cmp.Or(s.ChCount, DefaultChCount)
	s.QueueDepth = cmp.Or(s.QueueDepth, DefaultSessionQueueDepth)
	if s.ImmediateData == nil {
		s.ImmediateData = Bool(true)
	}
	s.ConnectTimeout = cmp.Or(s.ConnectTimeout, DefaultConnectTimeout)
	if s.ReconnectDelay == nil {
		s.ReconnectDelay = TimeoutOf(DefaultReconnectDelay)
	}
	if s.FastIOFailTmo == nil {
		s.FastIOFailTmo = TimeoutOf(DefaultFastIOFailTmo)
	}
	if s.DevLossTmo == nil {
		s.DevLossTmo = TimeoutOf(DefaultDevLossTmo)
	}
}

// SetDefaults fills the export's omitted limits.
func (e *NBDExport) SetDefaults() {
	e.MaxConnections = cmp.Or(e.MaxConnections, DefaultNBDMaxConnections)
	if e.WriteTimeout == nil {
		e.WriteTimeout = TimeoutOf(DefaultNBDWriteTimeout)
	}
}

// nilIfEmpty makes an empty list nil, so that "listen: []", an omitted list and a JSON [] are
// the same value (Equal, Diff, and Marshal, which omits empty lists).
func nilIfEmpty[T any](s *[]T) {
	if s != nil && len(*s) == 0 {
		*s = nil
	}
}
