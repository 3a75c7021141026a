"""Write the training image's SBOM (CycloneDX 1.6 JSON) from what is installed in it, and check it (.ci/image).

    python .ci/sbom.py PIP_INSPECT.json DPKG.tsv requirements.lock OUT.json NAME VERSION REVISION BASE BASE_DIGEST

* PIP_INSPECT.json: ``python -m pip inspect`` run inside the image (every Python distribution of its environment);
* DPKG.tsv: ``dpkg-query -W -f '${binary:Package}\\t${Version}\\t${Architecture}\\t${source:Package}\\n'`` run
  inside the image (every Debian package);
* requirements.lock: every Python distribution of the image but the project itself must be pinned there at the
  version installed (the Dockerfile installs with ``-c requirements.lock``), else this exits 1 naming them.

Components are named by package URL (``pkg:pypi/torch@2.14.1``, ``pkg:deb/debian/tini@0.19.0-1?arch=amd64&
distro=debian-12``); the image itself is the BOM's subject, with its commit and base image as properties. The file
is built with cyclonedx-python-lib and validated against the CycloneDX 1.6 JSON schema before it is written.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cyclonedx.model import Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL
from packaging.utils import canonicalize_name as canonical


def main(argv: list[str]) -> int:
    inspect_file, dpkg_file, lock_file, out, name, version, revision, base, base_digest = argv
    installed = json.loads(Path(inspect_file).read_text())["installed"]
    pinned = dict(
        (canonical(m.group(1)), m.group(2))
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", Path(lock_file).read_text(), re.MULTILINE)
    )
    image = Component(name=name, version=version, type=ComponentType.CONTAINER, bom_ref=f"image:{name}@{version}")
    image.properties.update([Property(name="revision", value=revision), Property(name="base", value=base)])
    image.properties.add(Property(name="base.digest", value=base_digest))
    bom = Bom()
    bom.metadata.component = image
    unpinned = []
    for dist in installed:
        meta = dist["metadata"]
        dist_name, dist_version = meta["name"], meta["version"]
        if canonical(dist_name) != canonical(name) and pinned.get(canonical(dist_name)) != dist_version:
            unpinned.append(f"{dist_name}=={dist_version} (lock: {pinned.get(canonical(dist_name), 'absent')})")
        purl = PackageURL(type="pypi", name=canonical(dist_name), version=dist_version)
        bom.components.add(
            Component(name=dist_name, version=dist_version, type=ComponentType.LIBRARY, purl=purl, bom_ref=str(purl))
        )
    debs = 0
    for line in Path(dpkg_file).read_text().splitlines():
        package, deb_version, arch, source = (line.split("\t") + [""] * 4)[:4]
        package = package.split(":")[0]
        qualifiers = {"arch": arch, "distro": "debian-12"}
        if source and source != package:
            qualifiers["upstream"] = source
        purl = PackageURL(type="deb", namespace="debian", name=package, version=deb_version, qualifiers=qualifiers)
        bom.components.add(
            Component(name=package, version=deb_version, type=ComponentType.APPLICATION, purl=purl, bom_ref=str(purl))
        )
        debs += 1
    bom.register_dependency(
        image, list(bom.components)
    )  # what the image holds, flat: the packages' own graph is not read
    if unpinned:
        print(f"error: the image holds Python packages not at requirements.lock's versions: {', '.join(unpinned)}")
        return 1
    text = JsonV1Dot6(bom).output_as_string(indent=1)
    if (problem := JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)) is not None:
        print(f"error: the SBOM does not validate against CycloneDX 1.6: {problem}")
        return 1
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    names = {c.name for c in bom.components}
    missing = {"torch", "lightning", "tini", "python3.11"} - names
    if missing:
        print(f"error: the SBOM lacks {sorted(missing)}")
        return 1
    print(f"sbom: {len(installed)} Python and {debs} Debian packages, CycloneDX 1.6 (schema-valid) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
