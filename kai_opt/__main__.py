"""`python -m kai_opt`: the `kai-opt` command line."""

from kai_opt.cli.main import main

if __name__ == "__main__":
    main()
