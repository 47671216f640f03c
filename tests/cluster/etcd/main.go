// etcd as its release binary runs it: etcd's own main package lives in a module whose replace
// directives `go build` refuses from outside it, so this calls the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
