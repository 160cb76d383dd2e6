"""`python -m gateway` is a shorthand for `python -m gateway.fake`."""

from gateway.fake.__main__ import main

if __name__ == "__main__":
    main()
