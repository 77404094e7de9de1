module github.com/srpd/srpd

go 1.26.0

require (
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/sys v0.50.0
	pgregory.net/rapid v1.3.0 // indirect
)
