"""A worker whose fatal line looks like rich markup and carries an escape sequence."""
import sys

print("step 0 loss [/] [bold]2.0\x1b]0;pwned\x07", flush=True)
print("KeyError: '[/red] labels'", flush=True)
sys.exit(1)
