"""`make lab`: JupyterLab on notebooks/ where a double-clicked `.py` opens as a notebook.

Each server test starts the server with the very command `make lab` runs (through make, with
LAB_PORT, LAB_ROOT, LAB_STATE, LAB_ARGS overridden; as root too, with no extra flag), HOME pointed
at an empty temp dir that must still be empty after the server is gone, and always stops it
(POST /api/shutdown, then the process group). The browser test needs Chromium (`chromium` on PATH)
and skips cleanly without it. `make lab` itself opens scratch/, a git-ignored copy of notebooks/
(tests/test_scratch.py); the browser test edits a notebook there and lets the lab autosave it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import skip_module_unless

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
NOTEBOOK = "02_masks_and_cta_skips.py"
START_TIMEOUT_S = 180  # a cold `jupyter lab` imports for ~15 s here (jsonschema's rfc3987 grammar)

skip_module_unless("jupytext", "jupyterlab")  # the notebooks extra


def _venv_ready() -> str | None:
    """Why `make lab` cannot run here without installing something, or None."""
    if shutil.which("make") is None:
        return "make is not on PATH"
    r = subprocess.run(["make", "-s", "-q", "-C", str(REPO), "venv"], capture_output=True, timeout=60)
    return None if r.returncode == 0 else "the venv is missing or stale (run `make venv`)"


@pytest.fixture(scope="module")
def make_lab_ready():
    why = _venv_ready()
    if why:
        pytest.skip(f"make lab: {why}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdlines() -> dict[int, list[str]]:
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            out[int(d.name)] = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


class Lab:
    """A `make lab` server on a free loopback port, with a token and a throwaway HOME."""

    def __init__(self, root: Path, tmp: Path, settings: dict | None = None, source: Path | None = None):
        self.root, self.tmp, self.settings, self.source = root, tmp, settings or {}, source
        self.home, self.state = tmp / "home", tmp / "lab-state"
        self.home.mkdir()
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "lab.log"
        self.proc: subprocess.Popen | None = None
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("JUPYTER", "XDG_", "IPYTHON")) and k not in ("MPLCONFIGDIR",)}
        self.env.update(HOME=str(self.home), JUPYTER_TOKEN=self.token)

    def start(self) -> Lab:
        for plugin, values in self.settings.items():  # user settings, as the lab's settings editor writes them
            f = self.state / "config" / "lab" / "user-settings" / f"{plugin.replace(':', '/')}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        args = "--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port_retries=0"  # no --allow-root, also as root
        cmd = self.make("lab", f"LAB_PORT={self.port}", f"LAB_ROOT={self.root}", f"LAB_ARGS={args}",
                        *([f"LAB_FROM={self.source}"] if self.source else []))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"make lab exited with {self.proc.returncode}:\n{self.log_text()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if self.request("GET", "/api/status", timeout=2)[0] == 200:
                    return self
            time.sleep(0.5)
        raise AssertionError(f"make lab did not answer within {START_TIMEOUT_S}s:\n{self.log_text()}")

    def make(self, target: str, *variables: str) -> list[str]:
        return ["make", "-s", "--no-print-directory", "-C", str(REPO), target, f"LAB_STATE={self.state}", *variables]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    def request(self, method: str, path: str, body=None, timeout: float = 30) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.request("POST", "/api/shutdown", timeout=10)  # stops the kernels too
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        # Kernels run in sessions of their own: any left (a failed shutdown) are found by their
        # connection file under this server's LAB_STATE and killed by pid.
        if Path("/proc").is_dir():
            for pid, argv in _cmdlines().items():
                if any(str(self.state) in a for a in argv) and pid != os.getpid():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def make_lab(root: Path, tmp: Path, settings: dict | None = None, source: Path | None = None):
    lab = Lab(root, tmp, settings, source)
    try:
        yield lab.start()
    finally:
        lab.stop()
    # after a clean stop: nothing of Jupyter's, IPython's, npm's or matplotlib's landed in HOME
    assert _files(lab.home) == [], f"make lab wrote into HOME: {_files(lab.home)}"


def _notebooks_copy(tmp: Path) -> Path:
    """notebooks/ as shipped (the .py files and jupytext.toml), for tests that write or open."""
    dst = tmp / "notebooks"
    dst.mkdir()
    for p in NOTEBOOKS.iterdir():
        if p.is_file() and (p.suffix == ".py" or p.name == "jupytext.toml"):
            shutil.copy2(p, dst / p.name)
    return dst


def _has_parameters_cell(nb: dict) -> bool:
    return any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


@pytest.mark.slow
def test_lab_serves_py_as_notebook_with_venv_kernel(make_lab_ready, tmp_path):
    before = _files(NOTEBOOKS)
    with make_lab(NOTEBOOKS, tmp_path) as lab:
        # the shipped default viewer: a .py (file type "python") opens with jupytext's notebook factory
        status, plugin = lab.request("GET", "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
        assert status == 200, plugin
        assert plugin["schema"]["properties"]["defaultViewers"]["default"].get("python") == "Jupytext Notebook"
        assert "python" not in plugin["settings"].get("defaultViewers", {})  # no user setting shadows it

        # what the lab asks for when it opens the file as a notebook
        status, model = lab.request("GET", f"/api/contents/{NOTEBOOK}?type=notebook&content=1")
        assert status == 200, model
        assert model["type"] == "notebook" and model["format"] == "json"
        nb = model["content"]
        assert nb["nbformat"] == 4 and len(nb["cells"]) > 3
        assert _has_parameters_cell(nb), "no cell tagged `parameters`"
        assert nb["metadata"]["kernelspec"]["name"] == "python3"

        # that kernel runs the venv's python (the interpreter running `make lab`'s jupyter), and the
        # header names it as the lab will (else the lab rewrites it on open)
        status, specs = lab.request("GET", "/api/kernelspecs")
        assert status == 200 and "python3" in specs["kernelspecs"], specs
        assert nb["metadata"]["kernelspec"]["display_name"] == specs["kernelspecs"]["python3"]["spec"]["display_name"]
        if Path("/proc").is_dir():
            status, kernel = lab.request("POST", "/api/kernels", {"name": "python3"})
            assert status in (200, 201), kernel
            argv, deadline = None, time.monotonic() + 30
            while argv is None and time.monotonic() < deadline:
                argv = next((a for a in _cmdlines().values() if any(f"kernel-{kernel['id']}.json" in x for x in a)),
                            None)
                time.sleep(0.2)
            assert argv, "the kernel process did not show up"
            venv_bin = Path(os.path.abspath(REPO / ".venv" / "bin"))
            assert Path(argv[0]).parent == venv_bin or Path(argv[0]).parent == Path(sys.executable).parent, argv
            assert lab.request("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204

        # `make lab-url` (what the README says) finds this server and its token
        r = subprocess.run(lab.make("lab-url"), env=lab.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f":{lab.port}/" in r.stdout and f"token={lab.token}" in r.stdout, r.stdout
    assert _files(NOTEBOOKS) == before, "opening the notebooks wrote into notebooks/"


@pytest.mark.slow
def test_lab_save_round_trip_writes_only_the_py(make_lab_ready, tmp_path):
    root = _notebooks_copy(tmp_path)
    original = (root / NOTEBOOK).read_text(encoding="utf-8")
    assert re.search(r"(?m)^window_left = None$", original)
    with make_lab(root, tmp_path) as lab:
        status, model = lab.request("GET", f"/api/contents/{NOTEBOOK}?type=notebook&content=1")
        assert status == 200, model
        nb = model["content"]
        # an edit in the parameters cell, and what the lab itself adds after a run
        params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        params["source"] = re.sub(r"(?m)^window_left = None$", "window_left = 8", params["source"])
        nb["metadata"]["language_info"] = {"name": "python", "version": sys.version.split()[0]}
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c["metadata"]["trusted"] = True
                c["execution_count"] = 1
                c["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "OUTPUT-NOT-SAVED\n"}]
        status, saved = lab.request("PUT", f"/api/contents/{NOTEBOOK}",
                                    {"type": "notebook", "format": "json", "content": nb})
        assert status in (200, 201), saved
        assert saved["path"] == NOTEBOOK and saved["type"] == "notebook"

    assert not [p for p in _files(root) if p.endswith(".ipynb")], f"a .ipynb was written: {_files(root)}"
    text = (root / NOTEBOOK).read_text(encoding="utf-8")
    assert "OUTPUT-NOT-SAVED" not in text and "language_info" not in text and "trusted" not in text

    # the .py is still the source: only the edit differs, the header is byte for byte the committed one
    assert text == re.sub(r"(?m)^window_left = None$", "window_left = 8", original)
    import jupytext

    assert _has_parameters_cell(jupytext.reads(text, fmt="py:percent"))


def test_jupytext_toml_leaves_swa_repro_run_alone():
    """`swa-repro run` converts with jupytext.read(path) (no config); the lab reads with the config
    of notebooks/jupytext.toml: both give the same notebook, and the config pairs nothing."""
    import jupytext
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_config

    assert Path(find_jupytext_configuration_file(str(NOTEBOOKS))) == NOTEBOOKS / "jupytext.toml"
    config = load_jupytext_config(str(NOTEBOOKS / NOTEBOOK))
    assert config.formats in ("py:percent", ["py:percent"])  # one format: paired with nothing
    def shape(nb) -> tuple:  # all but the random cell ids and the save-time filter jupytext notes from the config
        nb.metadata.get("jupytext", {}).pop("notebook_metadata_filter", None)
        return nb.metadata, [(c.cell_type, c.source, c.metadata) for c in nb.cells]

    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")):
        plain = shape(jupytext.read(path))
        assert plain == shape(jupytext.read(path, config=config)), path.name
        assert plain == shape(jupytext.reads(path.read_text(encoding="utf-8"), fmt="py:percent")), path.name


def _clean_jupyter_env(monkeypatch, home: Path) -> None:
    """This process's Jupyter paths as `make lab` has them: nothing from the caller's env or HOME."""
    for k in [k for k in os.environ if k.startswith(("JUPYTER", "IPYTHON"))]:
        monkeypatch.delenv(k)
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))


def test_save_of_an_opened_notebook_is_byte_identical(monkeypatch, tmp_path):
    """The lab marks a notebook changed on open (its kernel adds language_info, and names its
    kernelspec) and autosave writes it back through jupytext with the shipped config: for `git
    status` to stay clean, that write must give every committed .py back byte for byte."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupytext import TextFileContentsManager

    _clean_jupyter_env(monkeypatch, tmp_path / "home")
    spec = KernelSpecManager().get_kernel_spec("python3")  # what the lab's kernel picker finds
    root = _notebooks_copy(tmp_path)
    cm = TextFileContentsManager(root_dir=str(root))
    paths = sorted(root.glob("[0-9][0-9]_*.py"))
    assert len(paths) == len(list(NOTEBOOKS.glob("[0-9][0-9]_*.py"))) > 0
    for path in paths:
        committed = path.read_bytes()
        nb = cm.get(path.name, type="notebook", content=True)["content"]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": spec.display_name, "language": spec.language}
        nb.metadata["language_info"] = {"name": "python", "version": sys.version.split()[0], "file_extension": ".py"}
        cm.save({"type": "notebook", "format": "json", "content": nb}, path.name)
        assert path.read_bytes() == committed, f"{path.name}: a save rewrites it"


def test_make_lab_config_allows_root(monkeypatch, tmp_path):
    """As root (the usual case in containers) jupyter server stops unless allow_root: the config
    that `make lab` puts on JUPYTER_CONFIG_PATH sets it, so the command as printed works as root."""
    from jupyter_server.serverapp import ServerApp

    (tmp_path / "scratch").mkdir()  # what make lab fills before the server starts (-n runs nothing)
    dry = subprocess.run(["make", "-s", "-n", "-C", str(REPO), "lab", f"LAB_STATE={tmp_path / 'state'}",
                          f"LAB_ROOT={tmp_path / 'scratch'}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    words = shlex.split(next(ln for ln in dry.splitlines() if "/jupyter lab" in ln))
    lab_at = words.index("lab")  # ENV=... .venv/bin/jupyter lab ARGS
    _clean_jupyter_env(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(REPO)  # make runs the command from the repo root: root_dir is relative to it
    for w in words[:lab_at - 1]:
        monkeypatch.setenv(*w.split("=", 1))
    assert os.environ["JUPYTER_CONFIG_PATH"] == str(REPO / "jupyter")
    app = ServerApp()
    app.load_config_file()
    app.parse_command_line(words[lab_at + 1:])
    assert app.allow_root is True


# --- in a real browser -------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
AUTOSAVE_S = 2  # JupyterLab's autosaveInterval for the browser test (default 120 s), set as a user setting

PROBE_JS = r"""(() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const cells = panel ? panel.querySelectorAll('.jp-Cell') : [];
  const kernel = panel && panel.querySelector('.jp-KernelName, [data-jp-item-name="kernelName"]');
  return JSON.stringify({
    notebook: !!panel,
    cells: cells.length,
    heading: panel ? [...panel.querySelectorAll('.jp-MarkdownOutput h1')].map(h => h.textContent) : [],
    intro: panel ? ((panel.querySelector('.jp-MarkdownOutput') || {}).textContent || '') : '',
    fileEditor: !!document.querySelector('.jp-FileEditor'),
    dialog: !!document.querySelector('.jp-Dialog'),
    kernel: kernel ? kernel.textContent : null,
    statusbar: (document.querySelector('#jp-main-statusbar') || {}).textContent || '',
    tabs: [...document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tabLabel')].map(t => t.textContent),
    dirty: !!document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.jp-mod-dirty'),
  });
})()"""


EDIT_LINE = "window_left = 8  # explored in the lab"

# The parameters cell's editor, scrolled into view: where its last line ends (a click there puts
# the cursor at the end of the cell), and its prompt ("[N]:" once it ran).
PARAMS_CELL_JS = r"""(() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const cell = panel && [...panel.querySelectorAll('.jp-CodeCell')].find(
    c => ((c.querySelector('.cm-content') || {}).textContent || '').includes('window_left = None'));
  if (!cell) return JSON.stringify(null);
  const lines = cell.querySelectorAll('.cm-content .cm-line');
  lines[lines.length - 1].scrollIntoView({block: 'center'});
  const r = lines[lines.length - 1].getBoundingClientRect();
  return JSON.stringify({x: r.right - 4, y: r.top + r.height / 2,
                         text: cell.querySelector('.cm-content').innerText,
                         prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || ''});
})()"""


async def _cdp_probe(ws_url: str, timeout_s: float, screenshot: Path, saved=None, edited=None) -> dict:
    """What the lab shows once the notebook is open and its kernel idle; with ``saved`` (a
    callable), then also wait until it says a save happened and the tab is clean again; with
    ``edited`` (a callable) then edit the parameters cell as a user does (a click at its end, Enter,
    typed text, Shift+Enter to run it) and wait until the cell ran, ``edited()`` says the autosave
    wrote the edit and the tab is clean again."""
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(ws_url, max_message_size=256 << 20)
    ids = iter(range(1, 1 << 30))

    async def call(method: str, **params):
        i = next(ids)
        conn.write_message(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = await conn.read_message()
            if msg is None:
                raise ConnectionError("devtools websocket closed")
            msg = json.loads(msg)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def js(expression: str):
        r = await call("Runtime.evaluate", expression=expression, returnByValue=True)
        return json.loads(r["result"].get("value") or "null")

    async def key(name: str, code: int, modifiers: int = 0, text: str | None = None):
        extra = {"text": text, "unmodifiedText": text} if text else {}
        await call("Input.dispatchKeyEvent", type="keyDown", key=name, code=name, windowsVirtualKeyCode=code,
                   modifiers=modifiers, **extra)
        await call("Input.dispatchKeyEvent", type="keyUp", key=name, code=name, windowsVirtualKeyCode=code,
                   modifiers=modifiers)

    try:
        state, deadline = {}, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = await js(PROBE_JS) or {}
            if state.get("notebook") and state.get("cells") and state.get("heading") \
                    and "| Idle" in state.get("statusbar", ""):
                break  # opened as a notebook, and its kernel started and is idle
            if state.get("fileEditor"):
                break  # opened as text: no point waiting
            await asyncio.sleep(0.5)
        opened, state["autosaved"] = dict(state), False
        while saved is not None and opened.get("notebook") and time.monotonic() < deadline:
            state = {**(await js(PROBE_JS) or {}), "opened": opened}
            state["autosaved"] = saved() and not state.get("dirty")
            if state["autosaved"]:
                break
            await asyncio.sleep(0.5)
        if edited is not None and state.get("autosaved"):
            cell = await js(PARAMS_CELL_JS)
            state["edit"] = {"before": cell}
            if cell:
                for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                    await call("Input.dispatchMouseEvent", type=kind, x=cell["x"], y=cell["y"], button="left",
                               clickCount=1)
                await asyncio.sleep(0.3)
                await key("End", 35)
                await key("Enter", 13, text="\r")
                await call("Input.insertText", text=EDIT_LINE)
                await key("Enter", 13, modifiers=8, text="\r")  # Shift+Enter: run the cell
                while time.monotonic() < deadline:
                    probe, cell = await js(PROBE_JS) or {}, await js(PARAMS_CELL_JS) or {}
                    ran = re.search(r"\[\d+\]", cell.get("prompt", "")) is not None
                    state["edit"].update(after=cell, ran=ran, saved=edited(), dirty=probe.get("dirty"),
                                         statusbar=probe.get("statusbar"))
                    if ran and state["edit"]["saved"] and not probe.get("dirty"):
                        break
                    await asyncio.sleep(0.5)
        shot = await call("Page.captureScreenshot", format="png")
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        return state
    finally:
        conn.close()


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          env=env, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (`chromium` on PATH, Debian package chromium)")
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_lab_opens_py_as_notebook_in_chromium(make_lab_ready, tmp_path):
    """`make lab` on a clone (notebooks/ committed, the project's .gitignore) in a real browser: it
    opens scratch/, the notebook there opens as a notebook on the venv's kernel and says what a save
    does; JupyterLab's own autosave (the interval shortened as a user setting) rewrites it unchanged;
    then the parameters cell is edited and run as a user does it, and autosaved. `git status` stays
    clean throughout: the edit is in the git-ignored scratch copy, the tracked notebook is as
    committed, and the next `make lab` keeps the edit."""
    from swa_repro.notebook import scratch

    repo = tmp_path / "repo"
    repo.mkdir()
    tracked = _notebooks_copy(repo)
    shutil.copy2(REPO / ".gitignore", repo / ".gitignore")  # what `git status` ignores in the repo
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "notebooks as committed")
    committed = (tracked / NOTEBOOK).read_bytes()
    root = repo / "scratch"  # what make lab opens (LAB_ROOT's default, here in the clone)
    copied: list[int] = []  # the mtime of the copy make lab wrote, before the browser opens it

    def saved() -> bool:
        return (root / NOTEBOOK).stat().st_mtime_ns != copied[0]

    def edited() -> bool:
        return EDIT_LINE in (root / NOTEBOOK).read_text(encoding="utf-8")

    profile, chrome_home = tmp_path / "chromium-profile", tmp_path / "chromium-home"
    chrome_home.mkdir()
    screenshot = tmp_path / "lab.png"
    settings = {"@jupyterlab/docmanager-extension:plugin": {"autosaveInterval": AUTOSAVE_S}}
    with make_lab(root, tmp_path, settings, source=tracked) as lab:
        assert (root / NOTEBOOK).read_bytes() == committed, "make lab did not copy the notebooks to scratch/"
        copied.append((root / NOTEBOOK).stat().st_mtime_ns)
        assert "make lab: opening" in lab.log_text() and "your git-ignored copy of" in lab.log_text()
        url = f"{lab.base}/lab/tree/{NOTEBOOK}?token={lab.token}"
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--window-size=1440,900", f"--user-data-dir={profile}",
               "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", url]
        env = {**os.environ, "HOME": str(chrome_home)}
        with open(tmp_path / "chromium.log", "wb") as log:
            chrome = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        try:
            port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
                assert chrome.poll() is None, (tmp_path / "chromium.log").read_text(errors="replace")[-3000:]
                time.sleep(0.2)
            devtools_port = int(port_file.read_text().split()[0])
            ws_url, deadline = None, time.monotonic() + 30
            while ws_url is None and time.monotonic() < deadline:
                with urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page" and "/lab" in t.get("url", "")]
                ws_url = pages[0]["webSocketDebuggerUrl"] if pages else None
                time.sleep(0.2)
            assert ws_url, "no page with the lab in Chromium"
            state = asyncio.run(asyncio.wait_for(_cdp_probe(ws_url, 150, screenshot, saved, edited), timeout=210))
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if chrome.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(chrome.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    chrome.wait(timeout=10)
            if os.environ.get("SWA_LAB_SCREENSHOT") and screenshot.exists():
                dst = Path(os.environ["SWA_LAB_SCREENSHOT"])
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(screenshot, dst)
        # what the lab showed on open: a notebook panel with cells, the title rendered, the venv's kernel
        final, state = state, state.get("opened", state)
        assert state.get("notebook") and not state.get("fileEditor"), f"not opened as a notebook: {state}"
        assert state["cells"] > 3, state
        assert any("Masks and CTA skips" in h for h in state["heading"]), state
        intro = " ".join(state["intro"].split())  # the first cell, rendered: what a save does
        assert "your copy in scratch/ (git-ignored)" in intro and "write that copy only" in intro, intro
        assert NOTEBOOK in state["tabs"], state
        assert not state["dialog"], f"a dialog is open (kernel selection?): {state}"
        assert state["kernel"] and "Python 3" in state["kernel"], state
        assert "| Idle" in state["statusbar"], f"the kernel did not start: {state}"
        # then JupyterLab saved it (autosave: nothing else writes here), and that save changed nothing
        assert final["autosaved"], f"no autosave (autosaveInterval {AUTOSAVE_S} s) left the tab clean: {final}"
        # then the edit: typed into the parameters cell, run, and autosaved into the scratch copy
        edit = final.get("edit") or {}
        assert edit.get("before"), f"no parameters cell with `window_left = None` on the page: {final}"
        assert edit.get("ran"), f"the edited parameters cell did not run: {edit}"
        assert EDIT_LINE in edit["after"]["text"], edit
        assert edit.get("saved") and not edit.get("dirty"), f"no autosave wrote the edit: {edit}"
    assert not [p for p in _files(repo) if p.endswith(".ipynb")], _files(repo)
    text, original = (root / NOTEBOOK).read_text(encoding="utf-8"), committed.decode("utf-8")
    last = next(ln for ln in original.splitlines() if ln.startswith("fuzz_selftest_cases = "))
    assert text == original.replace(last + "\n", f"{last}\n{EDIT_LINE}\n", 1), "the save wrote more than the edit"
    # the tracked notebook is as committed, and git sees nothing to commit (scratch/ is ignored)
    assert (tracked / NOTEBOOK).read_bytes() == committed
    assert _git(repo, "status", "--porcelain") == "", _git(repo, "status", "--porcelain")
    assert "!! scratch/" in _git(repo, "status", "--porcelain", "--ignored").splitlines()
    # the next make lab keeps the edit
    assert {f: a for f, a, _ in scratch.sync(tracked, root)}[NOTEBOOK] == "kept"
    assert EDIT_LINE in (root / NOTEBOOK).read_text(encoding="utf-8")
