"""The `bebop` command line: parse, run the command, and turn every failure into one line on stderr and an exit
status (2 for bad input or a refused write, 130 when interrupted, 141 when the reader of stdout went away)."""

import importlib
import os
import sys

from safetensors import SafetensorError

from bebop.cli.parser import DEPRECATED_COMMANDS, build_parser
from bebop.engine.memory import retain_freed_memory
from bebop.errors import BebopError

def command(args):
    """The function that runs the parsed command: `args.func` names it as "module:function" of this package, so
    that parsing (and --help, and a bad flag) imports no command's dependencies."""
    module, name = args.func.split(":")
    return getattr(importlib.import_module(f"bebop.cli.{module}"), name)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command in DEPRECATED_COMMANDS:
        print(f"bebop: deprecated: {args.command}: use {DEPRECATED_COMMANDS[args.command]}", file=sys.stderr)
    retain_freed_memory()  # this process runs the engine: decode steps reuse freed blocks (bebop.engine.memory)
    try:
        command(args)(args)
    except BebopError as e:
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("bebop: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`bebop generate ... | head -1`): stop quietly, like `cat`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(141)
    except OSError as e:  # the disk or the file system refused (full, read-only, vanished): one line, no trace
        where = f" ({e.filename})" if e.filename else ""
        print(f"bebop: error: {e.strerror or e}{where}", file=sys.stderr)
        sys.exit(2)
    except SafetensorError as e:  # safetensors' own I/O error (a full disk while saving weights), not an OSError
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)

if __name__ == "__main__":
    main()
