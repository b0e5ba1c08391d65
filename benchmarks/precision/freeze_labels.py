"""Freeze a blind set's labels: check every label file against the sources it points at, and write
the corpus's labels.json and manifest.json, with its halves drawn at random.

    python benchmarks/precision/freeze_labels.py WORKDIR OUT SEED

WORKDIR holds commits.txt ("<owner>__<repo> <owner>/<repo> <commit>" per line), projects/<name>/ (the
sources at those commits) and labels/<name>.json (one helper's labels per project). Run it, commit OUT,
and only then scan any of the projects.
"""

import json
import pathlib
import random
import sys

root, out, seed = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
commits = {l.split()[0]: (l.split()[1], l.split()[2]) for l in (root/'commits.txt').read_text().split('\n') if l.strip()}
labels, done = [], []
for p in sorted(commits):
    f = root/'labels'/f'{p}.json'
    if not f.exists():
        print('missing', p); continue
    entries = json.loads(f.read_text())
    for e in entries:
        assert e['project'] == p and e['commit'] == commits[p][1], (p, e.get('commit'))
        src = root/'projects'/p/e['path']
        assert src.exists(), (p, e['path'])
        lines = src.read_text(errors='replace').split('\n')
        for lab in e['labels']:
            assert 1 <= lab['line'] <= len(lines), (p, e['path'], lab['line'])
    labels += entries; done.append(p)
names = sorted(done)
aside = set(random.Random(seed).sample(names, len(names) // 2))
manifest = [{"project": p, "repo": commits[p][0], "commit": commits[p][1], "half": "aside" if p in aside else "development"} for p in names]
brief = root/'BRIEF.md'
if brief.exists():
    (out/'LABELLING-BRIEF.md').write_text(brief.read_text())
(out/'labels.json').write_text(json.dumps(labels, indent=1) + '\n')
(out/'manifest.json').write_text(json.dumps(manifest, indent=1) + '\n')
n = sum(len(e['labels']) for e in labels)
wanted = sum(1 for e in labels for l in e['labels'] if not l.get('periodic') and l.get('confidence') == 'high' and not l.get('unresolved'))
print(len(names), 'projects', len(labels), 'files', n, 'labels', wanted, 'wanted'); print('aside', sorted(aside))
