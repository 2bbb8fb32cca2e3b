"""A small HTTP server that answers the requests huggingface_hub makes (model info, HEAD and GET of
/resolve/) for one repository, serving a local folder: the real client and the real files, no
network."""
from __future__ import annotations

import threading
import time


class FakeHub:
    def __init__(self, folder, repo, delay=0.0):
        import http.server

        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        hub = self
        self.requests = []
        self.delay = delay

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                import json
                from urllib.parse import unquote, urlsplit

                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                sha = "0123456789abcdef0123456789abcdef01234567"
                if path in (f"/api/models/{repo}", f"/api/models/{repo}/revision/main"):
                    body = json.dumps({"id": repo, "sha": sha, "siblings": [
                        {"rfilename": name, "size": p.stat().st_size} for name, p in files.items()]}).encode()
                    return self._send(200, body, [("Content-Type", "application/json")])
                prefix = f"/{repo}/resolve/"
                if path.startswith(prefix):
                    name = path[len(prefix):].split("/", 1)[1]
                    if name in files:
                        data = files[name].read_bytes()
                        start = 0
                        rng = self.headers.get("Range")
                        if rng and rng.startswith("bytes="):
                            start = int(rng[6:].split("-")[0])
                        headers = [("X-Repo-Commit", sha), ("ETag", f'"{len(data)}-{hash(name) & 0xffff}"')]
                        if self.command == "HEAD":
                            self.send_response(200)
                            for k, v in headers:
                                self.send_header(k, v)
                            self.send_header("Content-Length", str(len(data)))
                            self.end_headers()
                            return
                        body = data[start:]
                        self.send_response(206 if start else 200)
                        for k, v in headers:
                            self.send_header(k, v)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        for i in range(0, len(body), 256 * 1024):
                            time.sleep(hub.delay)
                            self.wfile.write(body[i:i + 256 * 1024])
                        return
                self._send(404, b'{"error": "not found"}', [("X-Error-Code", "RepoNotFound")])

            do_GET = do_HEAD = _route

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


