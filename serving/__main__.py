"""`python -m serving` / `ddops-serve`: the bundled runtime's entry point."""

import sys

from serving.config import parse_args


def main(argv=None) -> None:
    args = parse_args(argv)
    from serving.server.startup import serve   # heavy imports only after the flags are valid

    sys.exit(serve(args))


if __name__ == "__main__":
    main()
