"""``python -m trainfit``: the same CLI as the ``trainfit`` command (for environments where the
console script is not on PATH)."""

from trainfit.cli.entry import main

if __name__ == "__main__":
    main()
