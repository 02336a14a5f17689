"""`python -m components.engine.process`: the engine process a worker starts (serve.py)."""

from components.engine.process.serve import main

if __name__ == "__main__":
    main()
