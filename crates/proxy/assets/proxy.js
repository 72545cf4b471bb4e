// pando proxy's live dashboard: polls /dashboard/data once a second; one
// series per server; seconds where a server changed state are marked.
(function () {
  "use strict";
  var PALETTE = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#9b5de5", "#457b9d", "#6c757d"];
  var KEEP = 3600, WINDOW = 300;
  var state = { seconds: [], last: 0, polls: 0, errors: 0, charts: [], urls: null };
  window.pandoProxyDashboard = state;

  function text(el, s) { el.textContent = s; return el; }
  function time(t) { return new Date(t * 1000).toISOString().substr(11, 8) + "Z"; }

  function marks(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    state.seconds.forEach(function (s) {
      if (!s.events.length || s.t <= state.last - WINDOW) return;
      var x = u.valToPos(s.t, "x", true);
      var w = Math.max(3, Math.abs(u.valToPos(s.t + 0.5, "x", true) - u.valToPos(s.t - 0.5, "x", true)));
      ctx.save();
      ctx.fillStyle = "rgba(230, 57, 70, 0.25)";
      ctx.fillRect(x - w / 2, top, w, h);
      ctx.restore();
    });
  }

  function chart(id, title, series) {
    var box = document.createElement("div");
    box.className = "chart";
    box.id = "chart-" + id;
    text(box.appendChild(document.createElement("h2")), title);
    document.getElementById("charts").appendChild(box);
    var opts = {
      width: Math.max(520, box.clientWidth - 14), height: 200,
      series: [{}].concat(series.map(function (s) { return { label: s.label, stroke: s.stroke, width: 1.5 }; })),
      scales: { x: { time: true } }, axes: [{}, { size: 56 }], hooks: { draw: [marks] }
    };
    var plot = new uPlot(opts, [[]].concat(series.map(function () { return []; })), box);
    state.charts.push({ plot: plot, series: series });
  }

  function build(urls) {
    state.urls = urls;
    var per = function (field) {
      return urls.map(function (url, i) {
        return { label: url, stroke: PALETTE[i % PALETTE.length], value: function (s) {
          var x = s.servers[i]; return x ? x[field] : null; } };
      });
    };
    chart("ops", "Operations sent per second, by server", per("ops"));
    chart("outstanding", "Operations outstanding, by server", per("outstanding"));
    chart("clients", "Client connections and operations per second", [
      { label: "clients", stroke: "#264653", value: function (s) { return s.clients; } },
      { label: "ops/s", stroke: "#e76f51", value: function (s) { return s.ops; } }]);
  }

  function redraw() {
    var shown = state.seconds.filter(function (s) { return s.t > state.last - WINDOW; });
    var xs = shown.map(function (s) { return s.t; });
    state.charts.forEach(function (c) {
      c.plot.setData([xs].concat(c.series.map(function (ser) { return shown.map(ser.value); })));
    });
    var s = state.seconds[state.seconds.length - 1];
    if (!s) return;
    text(document.getElementById("now"), s.ops + " ops/s, " + s.clients + " clients");
    var body = document.querySelector("#servers tbody");
    body.textContent = "";
    s.servers.forEach(function (x) {
      var tr = body.appendChild(document.createElement("tr"));
      [x.url, x.role, x.state, x.writes ? "yes" : "", String(x.ops), String(x.outstanding), x.why].forEach(function (v, k) {
        var td = text(tr.appendChild(document.createElement("td")), v);
        if (k === 2) td.className = x.state === "in rotation" ? "" : x.state;
      });
    });
    var events = document.querySelector("#events tbody");
    events.textContent = "";
    state.seconds.filter(function (x) { return x.events.length; }).slice(-50).reverse().forEach(function (x) {
      x.events.forEach(function (e) {
        var tr = events.appendChild(document.createElement("tr"));
        tr.className = "event";
        text(tr.appendChild(document.createElement("td")), time(x.t));
        text(tr.appendChild(document.createElement("td")), e);
      });
    });
  }

  function poll() {
    fetch("/dashboard/data?since=" + state.last, { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (d) {
        d.seconds.forEach(function (s) {
          if (!state.urls) build(s.servers.map(function (x) { return x.url; }));
          state.seconds.push(s);
          state.last = s.t;
        });
        if (state.seconds.length > KEEP) state.seconds.splice(0, state.seconds.length - KEEP);
        state.polls++;
        text(document.getElementById("status"), "live, " + state.seconds.length + " s kept");
        redraw();
      })
      .catch(function (e) {
        state.errors++;
        text(document.getElementById("status"), "no answer from the proxy: " + e.message);
      });
  }
  poll();
  setInterval(poll, 1000);
})();
