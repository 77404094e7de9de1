//go:build !gendocs

package main

import "github.com/spf13/cobra"

// packagingCmds: none in the srpctl that ships; see gendocs.go.
func packagingCmds(*app) []*cobra.Command { return nil }
