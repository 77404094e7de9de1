module github.com/srpd/srpd

go 1.26
