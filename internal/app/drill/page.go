package drill

import "html/template"

// page is report.html: inline CSS, inline SVG, no script, no external
// font or resource.
var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Lifeline drill report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f1f5f9;color:#0f172a}
header{background:#0f172a;color:#f8fafc;padding:20px 32px}
header h1{margin:0 0 6px;font-size:22px}
.totals span{display:inline-block;margin-right:14px;padding:2px 10px;border-radius:12px;font-weight:600}
main{padding:20px 32px;display:grid;gap:18px}
.card{background:#fff;border-radius:10px;padding:16px 20px;box-shadow:0 1px 3px #0002;border-left:6px solid #94a3b8}
.card.pass{border-left-color:#16a34a}.card.fail{border-left-color:#dc2626}.card.not_available{border-left-color:#94a3b8}
.card h2{margin:0;font-size:18px}.expect{color:#475569;margin:2px 0 8px}
.badge{font-size:12px;font-weight:700;padding:2px 8px;border-radius:10px;margin-left:8px;vertical-align:middle;text-transform:uppercase}
.pass .badge,.b-pass{background:#dcfce7;color:#166534}.fail .badge,.b-fail{background:#fee2e2;color:#991b1b}
.not_available .badge,.b-na{background:#e2e8f0;color:#334155}
.detail{font-weight:500;margin:6px 0 10px}
.figs{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:10px}
.fig{background:#f8fafc;border:1px solid #e2e8f0;border-radius:8px;padding:4px 10px}
.fig b{display:block;font-size:17px}.fig small{color:#64748b}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
svg{background:#fcfcfd;border:1px solid #e2e8f0;border-radius:8px;max-width:100%;height:auto}
@media (max-width:900px){header{padding:14px 16px}main{padding:12px 10px;gap:12px}.card{padding:12px 12px}}
.lane,.tick,.hname{font:11px system-ui,sans-serif;fill:#475569}.hname{fill:#0f172a;font-weight:600}
.grid{stroke:#e2e8f0}.axis{stroke:#94a3b8}.bar{fill:#3b82f6}
.span{fill:#16a34a}.span.err{fill:#dc2626}.ev{stroke:#0f172a}.evn{font:10px system-ui,sans-serif;fill:#334155}
</style></head><body>
<header><h1>Lifeline drill report</h1>
<div>{{.When}} · {{.Doc.Cluster}}</div>
<div class="totals"><span class="b-pass">{{.Pass}} pass</span><span class="b-fail">{{.Fail}} fail</span><span class="b-na">{{.NA}} not available</span></div>
</header><main>
{{range .Cards}}<section class="card {{.Result}}" id="drill-{{.Number}}">
<h2>{{.Number}}. {{.Name}}<span class="badge">{{.Result}}</span></h2>
<div class="expect">{{.Expect}}</div>
<div class="detail">{{.Detail}}</div>
{{if .Keys}}<div class="figs">{{$f := .Figs}}{{range .Keys}}<div class="fig"><b>{{index $f .}}</b><small>{{.}}</small></div>{{end}}</div>{{end}}
<div class="charts">{{.Timeline}}{{range .Histogram}}{{.}}{{end}}</div>
{{if .Traces}}<h3>Traces of requests the fault hit</h3><div class="charts">{{range .Traces}}{{.}}{{end}}</div>{{end}}
</section>
{{end}}</main></body></html>
`))
