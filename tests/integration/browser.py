"""A real headless browser (Debian's chromium) driven over the DevTools
protocol: open a page, evaluate JavaScript in it, take screenshots.

The browser gets a proxy that answers nothing for every address but
loopback, so a page that needs the internet fails to load in it."""

import base64
import json
import shutil
import subprocess
import time
import urllib.request

import pytest

from conftest import free_port


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, profile_dir):
        import websocket  # websocket-client

        binary = chromium_binary()
        if binary is None:
            pytest.skip("no chromium here (scripts/test installs Debian's)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--user-data-dir=%s" % profile_dir,
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=%d" % self.port,
             # No network: every request but to loopback goes to a proxy that is not there.
             "--proxy-server=127.0.0.1:9", "--window-size=1400,1800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json" % self.port, timeout=2))
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("chromium did not start")
            time.sleep(0.2)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
        raise TimeoutError(method)

    def open(self, url, timeout=20):
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while self.eval("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError("page %s did not load" % url)
            time.sleep(0.1)

    def eval(self, expression, wait=False):
        """The value of `expression` (wait: of the promise it gives)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=wait)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def screenshot(self, path):
        r = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
