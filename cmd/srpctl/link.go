package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/srpd/srpd/transport/verbs"
)

// rdmaLink is an RDMA device as RDMA netlink reports it (`rdma link` / `rdma dev`).
type rdmaLink struct {
	Name            string `json:"name"`
	Index           uint32 `json:"index"`
	NodeGUID        string `json:"node_guid"`
	SysImageGUID    string `json:"sys_image_guid"`
	FirmwareVersion string `json:"firmware_version,omitempty"`
	Ports           uint32 `json:"ports"`
}

// linkManager creates, lists and deletes RDMA links, and lists the devices the verbs engine
// sees; netlinkLinks is the real one.
type linkManager interface {
	List() ([]rdmaLink, error)
	Add(name, typ, netdev string) error
	Delete(name string) error
	// VerbsDevices lists the RDMA devices libibverbs opens (transport/verbs.DeviceNames); it
	// fails with verbs.ErrUnavailable in a build without -tags verbs.
	VerbsDevices() ([]string, error)
}

// netlinkLinks talks RDMA netlink (NETLINK_RDMA) through github.com/vishvananda/netlink.
type netlinkLinks struct{}

func (netlinkLinks) List() ([]rdmaLink, error) {
	ls, err := netlink.RdmaLinkList()
	if err != nil {
		return nil, netlinkError("list RDMA links", err)
	}
	out := make([]rdmaLink, 0, len(ls))
	for _, l := range ls {
		out = append(out, rdmaLink{Name: l.Attrs.Name, Index: l.Attrs.Index, NodeGUID: rdmaGUID(l.Attrs.NodeGuid),
			SysImageGUID: rdmaGUID(l.Attrs.SysImageGuid), FirmwareVersion: l.Attrs.FirmwareVersion, Ports: l.Attrs.NumPorts})
	}
	return out, nil
}

// rdmaGUID turns a GUID as vishvananda/netlink formats it (the kernel's u64 written out
// little-endian as a MAC-style string: rxe's node GUID 5054:00ff:fe77:0002 comes as
// "02:00:77:fe:ff:00:54:50") into the form `rdma dev` and sysfs print. Other strings are
// returned unchanged.
func rdmaGUID(s string) string {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 8 {
		return s
	}
	var v uint64
	for i := len(hw) - 1; i >= 0; i-- {
		v = v<<8 | uint64(hw[i])
	}
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

func (netlinkLinks) VerbsDevices() ([]string, error) { return verbs.DeviceNames() }

func (netlinkLinks) Add(name, typ, netdev string) error {
	if _, err := net.InterfaceByName(netdev); err != nil {
		return fmt.Errorf("network interface %q: %w (ip link show lists them)", netdev, errNotFound)
	}
	if err := netlink.RdmaLinkAdd(name, typ, netdev); err != nil {
		return netlinkError(fmt.Sprintf("add RDMA link %s (type %s on %s)", name, typ, netdev), err)
	}
	return nil
}

func (n netlinkLinks) Delete(name string) error {
	ls, err := n.List()
	if err != nil {
		return err
	}
	for _, l := range ls {
		if l.Name == name {
			if err := netlink.RdmaLinkDel(name); err != nil {
				return netlinkError("delete RDMA link "+name, err)
			}
			return nil
		}
	}
	return fmt.Errorf("RDMA link %q: %w", name, errNotFound)
}

// kernelError is a netlink failure with the exit-code kind it maps to.
type kernelError struct {
	op   string
	kind error // errUnsupported, errPermission, errConflict, errNotFound or nil
	err  error
}

func (e *kernelError) Error() string {
	switch e.kind {
	case errUnsupported:
		return fmt.Sprintf("%s: this kernel has no RDMA netlink support (NETLINK_RDMA: %v); "+
			"the rdma_rxe/ib_core modules are missing or not loaded (try `modprobe rdma_rxe`). "+
			"srpd's softroce transport needs no kernel RDMA support", e.op, e.err)
	case errPermission:
		return fmt.Sprintf("%s: %v (managing RDMA links needs CAP_NET_ADMIN: run as root)", e.op, e.err)
	}
	return fmt.Sprintf("%s: %v", e.op, e.err)
}

func (e *kernelError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// netlinkError classifies an RDMA netlink error by its errno.
func netlinkError(op string, err error) error {
	var kind error
	switch {
	case errors.Is(err, syscall.EPROTONOSUPPORT), errors.Is(err, syscall.EAFNOSUPPORT), errors.Is(err, syscall.ENOSYS),
		errors.Is(err, syscall.EOPNOTSUPP):
		kind = errUnsupported
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		kind = errPermission
	case errors.Is(err, syscall.EEXIST):
		kind = errConflict
	case errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.ENOENT):
		kind = errNotFound
	}
	return &kernelError{op: op, kind: kind, err: err}
}
