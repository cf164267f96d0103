"""Warm kernels for `make book`: import the libraries once, then fork a kernel per notebook.

Every notebook's kernel imports the same libraries before its first experiment runs: torch,
`torch._dynamo` (transformers' modeling code imports it), transformers,
pandas, matplotlib, IPython and ipykernel. That is about 7 s of one core per notebook, and eight
notebooks spend more time importing than measuring. Here one process (the *warm server*) imports
them once and forks a kernel for each notebook that `scripts/book.py execute` runs.

    python scripts/warm_kernels.py serve SOCKET      the server: import, then fork on request
    python scripts/warm_kernels.py kernel SOCKET ARGS the kernel command a KernelManager starts

A forked kernel is an ordinary `ipykernel` kernel, started with the arguments, the environment
and the folder that jupyter_client gave the `kernel` command; only its imports were done before
the fork. The server runs no tensor operation and its imports start no thread (it checks; the one
numpy's OpenBLAS starts is stopped by OpenBLAS's own fork handler), so no thread pool is copied
half-made. A notebook still runs alone, in Colab or JupyterLab, with its own fresh kernel: this
is the build's shortcut, not the book's.

Lifetimes: the `kernel` command lives as long as its forked kernel, and the kernel ends when the
command is killed (jupyter_client's shutdown), by a closed socket. The server ends when the
build closes its standard input. `WHY_SELF_ATTENTION_WARM=0` turns the shortcut off.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import warnings

#: What every notebook's kernel imports, imported once by the server. Not matplotlib.pyplot:
#: the inline backend hooks itself into the running IPython shell when pyplot is first
#: imported, and the server has no shell.
PRELOAD = (
    # the kernel
    "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell",
    "ipykernel.debugger",
    # the libraries every page imports
    "numpy", "pandas", "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
    "torch", "torch.nn.functional", "torch.utils.flop_counter", "torch._dynamo", "torch.func",
    "torch.nn.attention.flex_attention", "transformers", "myst_nb", "tx_part4",
    # what transformers imports once a model, a config or a tokenizer is built: every page
    # builds one (transformers imports lazily, by the name asked for)
    "transformers.modeling_utils", "transformers.cache_utils", "transformers.masking_utils",
    "transformers.generation", "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto", "transformers.tokenization_utils_tokenizers",
    "safetensors.torch", "transformers.models.bert.modeling_bert",
    "transformers.models.llama.modeling_llama", "transformers.models.mistral.modeling_mistral",
    # what drawing a figure or a table imports, but pyplot and the inline backend
    "matplotlib.style", "IPython.core.pylabtools", "pandas.io.formats.html",
    "pandas.io.formats.string", "PIL.PngImagePlugin", "PIL.JpegImagePlugin",
    "PIL.BmpImagePlugin", "PIL.GifImagePlugin", "PIL.PpmImagePlugin",
)


#: The environment variables the server's imports set (a kernel's own imports would set them).
IMPORTS_SET: dict[str, str] = {}


def threads() -> int:
    """The process's threads as the kernel counts them (a fork copies only the calling one)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def preload() -> None:
    """Import PRELOAD, quietly: a warning an import raises belongs to the notebook that imports."""
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            # another release without it: the kernel imports its own
            with contextlib.suppress(ImportError):
                importlib.import_module(name)


def start_kernel(connection: socket.socket, request: dict) -> None:
    """In the forked child: become the kernel jupyter_client asked for, then exit."""
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        # The kernel's environment, and what the imports set in the server's (a cold kernel's
        # imports set it too: TORCHINDUCTOR_CACHE_DIR, say).
        os.environ.update({**IMPORTS_SET, **request["env"]})
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def watch() -> None:          # the `kernel` command was killed: so is this kernel
            try:
                connection.recv(1)
            finally:
                os._exit(0)

        threading.Thread(target=watch, daemon=True).start()
        import random

        random.seed()                 # as a fresh process: its own seed
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        from ipykernel.kernelapp import IPKernelApp

        # Two defaults ipykernel read from the environment when the server imported it: read
        # them again from the kernel's (without its parent, a kernel prints a banner).
        IPKernelApp.launch_instance(
            parent_handle=int(os.environ.get("JPY_PARENT_PID") or 0),
            interrupt=int(os.environ.get("JPY_INTERRUPT_EVENT") or 0))
    except BaseException as error:    # noqa: BLE001 — a child never returns into the server
        print(f"warm kernel: {type(error).__name__}: {error}", file=sys.stderr)
        os._exit(1)
    os._exit(0)


def serve(path: str) -> None:
    """Import, then fork a kernel for each request on the socket at `path`, until stdin closes."""
    # As `python -m ipykernel_launcher`: the kernel's sys.path has no scripts/ folder first.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    # numpy's OpenBLAS starts its thread pool on import; OpenBLAS stops it before a fork (its
    # pthread_atfork handler) and each kernel starts its own. Any other thread is a refusal.
    import numpy  # noqa: F401

    expected = threads()
    before = dict(os.environ)
    preload()
    IMPORTS_SET.update({k: v for k, v in os.environ.items() if k not in before})
    if threads() != expected:
        print(f"warm kernels: {threads() - expected} thread(s) started by the imports",
              file=sys.stderr)
        sys.exit(3)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)    # the socket appears only when it accepts
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
            while children:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
                return                # the build closed our stdin: it is done
            if listener in ready:
                connection, _ = listener.accept()
                request = json.loads(connection.makefile("r").readline())
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    start_kernel(connection, request)
                children.add(pid)
                connection.sendall(f"{pid}\n".encode())    # whom the command signals
                connection.close()
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        listener.close()
        for leftover in (path, path + ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def kernel_manager(path: str, config=None, kernel_name: str = "python3"):
    """A KernelManager whose kernel is forked by the server at `path` (the python3 kernel spec,
    its connection file and environment; only the command differs)."""
    from jupyter_client.manager import AsyncKernelManager

    class WarmKernelManager(AsyncKernelManager):       # nbclient's own kind of manager
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            if command[1:3] != ["-m", "ipykernel_launcher"]:
                return command            # another kernel: started as its spec says
            return [sys.executable, os.path.abspath(__file__), "kernel", path, *command[3:]]

    return WarmKernelManager(kernel_name=kernel_name, config=config)


class Server:
    """The warm server as the build holds it: started at once, asked whether it is ready."""

    def __init__(self, env: dict[str, str]):
        import subprocess
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="warm-kernels-")
        self.path = os.path.join(self.folder, "socket")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", self.path],
            stdin=subprocess.PIPE, env=env)
        self.reason = ""

    def ready(self, timeout: float = 120.0) -> bool:
        """Wait until the server accepts; False (and `reason`) if it ended or took too long."""
        while not os.path.exists(self.path):
            code = self.process.poll()
            if code is not None:
                self.reason = f"the server ended with code {code}"
                return False
            if time.perf_counter() - self.started > timeout:
                self.reason = f"the server was not ready in {timeout:g} s"
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        """End the server: it stops its kernels, removes its socket and folder, and exits, on
        its own time (Python's exit after torch takes a second or two: nobody waits for it)."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()


def kernel(path: str, argv: list[str]) -> None:
    """Ask the server at `path` for a kernel with `argv`; live as long as it does, and pass it
    the signals jupyter_client sends (an interrupt, a polite stop)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    connection.sendall((json.dumps(request) + "\n").encode())
    replies = connection.makefile("rb")
    pid = int(replies.readline() or 0)
    if not pid:
        sys.exit("warm kernels: the server did not start a kernel")

    def forward(signum, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if signum == signal.SIGTERM:
            sys.exit(0)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    while replies.read(1024):         # the kernel's end closes when it exits
        pass


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)                   # not Python's teardown: seconds, once torch is loaded
    if len(argv) >= 2 and argv[0] == "kernel":
        kernel(argv[1], argv[2:])
        return 0
    print("usage: warm_kernels.py serve SOCKET | kernel SOCKET ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
