"""Entry point of the sandbox child: `python -I -S <this directory>` (see `jaxagent.envs.host.sandbox`).

Run so, sys.path[0] is this directory. The package is imported by its name from the directory above,
then sys.path is left as `python -I -S` leaves it for a single file (the standard library only), so
the model's code cannot import the child's modules by their bare names.
"""
import os
import sys

if __package__:  # python -m jaxagent.envs.host.sandbox_child
    from .modes import main
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and sys.path[0] == _here:
        del sys.path[0]
    sys.path.append(os.path.dirname(_here))
    try:
        from sandbox_child.modes import main
    finally:
        sys.path.pop()

main()
