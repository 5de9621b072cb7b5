#!/usr/bin/env python3
"""Interoperability check: Sendium's SMPP server against python-smpplib, an SMPP
implementation that is not ours.

Binds as a transceiver, sends a short GSM message, a long UCS2 message (split into UDH
parts by smpplib itself) and a long GSM message, every part asking for a receipt, then
waits for one delivery receipt per part and checks that each receipt carries the id
Sendium returned in that part's submit_sm_resp. Exit status 0 on success.

usage: smpplib_interop.py HOST PORT SYSTEM_ID PASSWORD
"""
import sys
import time

import smpplib.client
import smpplib.consts
import smpplib.gsm


def main():
    host, port, system_id, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    acked = {}      # sequence -> message id
    receipts = {}   # message id -> receipt text
    client = smpplib.client.Client(host, port, allow_unknown_opt_params=True, timeout=10)

    def sent(pdu):
        if pdu.status != 0:
            raise SystemExit(f"submit_sm_resp status {pdu.status:#x}")
        acked[pdu.sequence] = pdu.message_id.decode()

    def received(pdu):
        mid = pdu.receipted_message_id
        text = pdu.short_message.decode(errors="replace")
        if mid:
            receipts[mid.decode()] = text
        elif text.startswith("id:"):
            receipts[text.split()[0][3:]] = text
        return 0  # deliver_sm_resp ESME_ROK

    client.set_message_sent_handler(sent)
    client.set_message_received_handler(received)
    client.connect()
    client.bind_transceiver(system_id=system_id, password=password)

    messages = [
        "Hello from python-smpplib",
        "Привет из python-smpplib! " * 6,  # UCS2, several parts
        "A long GSM message through Sendium. " * 8,  # GSM, several parts
    ]
    parts_sent = 0
    for text in messages:
        parts, coding, esm = smpplib.gsm.make_parts(text)
        for part in parts:
            client.send_message(
                source_addr_ton=smpplib.consts.SMPP_TON_ALNUM,
                source_addr_npi=smpplib.consts.SMPP_NPI_UNK,
                source_addr="Interop",
                dest_addr_ton=smpplib.consts.SMPP_TON_INTL,
                dest_addr_npi=smpplib.consts.SMPP_NPI_ISDN,
                destination_addr="447700900321",
                short_message=part,
                data_coding=coding,
                esm_class=esm,
                registered_delivery=True,
            )
            parts_sent += 1

    deadline = time.time() + 20
    while (len(acked) < parts_sent or len(receipts) < parts_sent) and time.time() < deadline:
        client.read_once()

    missing = [mid for mid in acked.values() if mid not in receipts]
    print(f"parts sent {parts_sent}, acknowledged {len(acked)}, receipts {len(receipts)}")
    for mid in list(acked.values())[:3]:
        print(f"  {mid}: {receipts.get(mid, '<no receipt>')}")
    client.unbind()
    client.disconnect()
    if len(acked) != parts_sent or missing or not all("stat:DELIVRD" in t for t in receipts.values()):
        print(f"FAIL: {len(missing)} acknowledged parts without a DELIVRD receipt", file=sys.stderr)
        return 1
    print("OK: every part acknowledged by Sendium got its own DELIVRD receipt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
