package main
import (
 _ "github.com/spf13/cobra"
 _ "github.com/jackc/pgx/v5"
 _ "github.com/rogpeppe/go-internal/testscript"
)
func main(){}
