"""Writes the seed corpus of the port-mapping fuzz targets (fuzz_portmap.h):

    python3 test/fuzz/gen_portmap_corpus.py test/fuzz/corpus

Good replies of every kind the clients read, the same with one thing wrong,
and the replies the unit tests throw at them. Deterministic: the same files
every run. The PCP nonce and request match fuzz_pcp_reply's fixed request."""

import os
import struct
import sys

NONCE = b"\x5a" * 12


def mapped4(ip):
    return b"\x00" * 10 + b"\xff\xff" + bytes(ip)


def pcp(result=0, lifetime=3600, epoch=5000, proto=6, iport=7447, eport=7447, ip=(11, 77, 0, 2), nonce=NONCE,
        opcode=1, version=2, options=b""):
    head = struct.pack(">BBBBII", version, 0x80 | opcode, 0, result, lifetime, epoch) + b"\x00" * 12
    if opcode != 1:
        return head + options
    body = nonce + struct.pack(">B3xHH", proto, iport, eport) + mapped4(ip)
    return head + body + options


def option(code, data):
    pad = (-len(data)) % 4
    return struct.pack(">BBH", code, 0, len(data)) + data + b"\x00" * pad


def natpmp_public(result=0, ip=(11, 77, 0, 2)):
    return struct.pack(">BBHI", 0, 128, result, 1000) + bytes(ip)


def natpmp_map(op=130, result=0, iport=7447, eport=7447, life=3600):
    return struct.pack(">BBHIHHI", 0, op, result, 1000, iport, eport, life)


def soap(action, fields):
    body = "".join(f"<{k}>{v}</{k}>" for k, v in fields.items())
    return (f'<?xml version="1.0"?>\r\n<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
            f's:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/"><s:Body>'
            f'<u:{action}Response xmlns:u="urn:schemas-upnp-org:service:WANIPConnection:1">{body}'
            f'</u:{action}Response></s:Body></s:Envelope>\r\n').encode()


def main(root):
    seeds = {
        "pcp_reply": {
            "map_ok": pcp(),
            "map_udp": pcp(proto=17),
            "map_delete": pcp(lifetime=0, eport=0),
            "map_refused": pcp(result=2, lifetime=30),
            "map_error_header_only": pcp(result=3)[:24],
            "map_options": pcp(options=option(0x12, b"\x01\x02\x03\x04\x05") + option(0x80, b"")),
            "map_option_overrun": pcp(options=struct.pack(">BBH", 0x12, 0, 40)),
            "map_truncated": pcp()[:58],
            "map_foreign_nonce": pcp(nonce=b"\x01" * 12),
            "map_v6_address": pcp()[:44] + b"\x20\x01" + b"\x00" * 14,
            "map_zero_address": pcp(ip=(0, 0, 0, 0)),
            "announce": pcp(opcode=0),
            "request_not_reply": b"\x02\x01" + pcp()[2:],
            "natpmp_answer": struct.pack(">BBHI", 0, 129, 1, 5000),
            "version_3": pcp(version=3, result=1),
            "oversize": pcp() + b"\x00" * 1044,
        },
        "natpmp_reply": {
            "public_ok": natpmp_public(),
            "public_zero": natpmp_public(ip=(0, 0, 0, 0)),
            "map_tcp_ok": natpmp_map(),
            "map_udp_ok": natpmp_map(op=129),
            "map_refused": natpmp_map(result=2),
            "error_header_only": natpmp_map(result=3)[:8],
            "truncated": natpmp_map()[:4],
            "padded": natpmp_map() + b"\x00",
            "pcp_version": pcp()[:16],
            "request_op": struct.pack(">BBHI", 0, 2, 0, 0),
        },
        "upnp_reply": {
            "external_ip": soap("GetExternalIPAddress", {"NewExternalIPAddress": "11.77.0.2"}),
            "external_ip_bad": soap("GetExternalIPAddress", {"NewExternalIPAddress": "11.77.0.256"}),
            "external_ip_empty": soap("GetExternalIPAddress", {"NewExternalIPAddress": ""}),
            "entry_ok": soap("GetSpecificPortMappingEntry", {
                "NewInternalPort": "7447", "NewInternalClient": "10.77.1.2", "NewEnabled": "1",
                "NewPortMappingDescription": "gwtf", "NewLeaseDuration": "3600"}),
            "entry_other_client": soap("GetSpecificPortMappingEntry", {
                "NewInternalPort": "7447", "NewInternalClient": "10.77.1.3", "NewLeaseDuration": "3600"}),
            "entry_bad_lease": soap("GetSpecificPortMappingEntry", {
                "NewInternalPort": "7447", "NewInternalClient": "10.77.1.2", "NewLeaseDuration": "99999999999"}),
            "fault": soap("Fault", {"faultcode": "s:Client", "errorCode": "725"}),
            "unclosed": soap("GetExternalIPAddress", {"NewExternalIPAddress": "11.77.0.2"})[:120],
        },
    }
    for sub, files in seeds.items():
        d = os.path.join(root, sub)
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(files)} files")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
