//! Metric names, label values and per-read tallies (so the hot path touches the metrics
//! registry once per read and command, not once per PDU).

use rusmpp::{CommandId, CommandStatus};

pub(super) const SESSIONS: &str = "sendium_smpp_sessions";
pub(super) const PDUS: &str = "sendium_smpp_pdus_total";
pub(super) const ERRORS: &str = "sendium_smpp_errors_total";
pub(super) const BINDS_REFUSED: &str = "sendium_smpp_binds_refused_total";
pub(super) const DELIVERS: &str = "sendium_smpp_deliver_total";

/// The command label values, indexed by [`command_index`].
const COMMANDS: [&str; 13] = [
    "bind_transmitter",
    "bind_receiver",
    "bind_transceiver",
    "submit_sm",
    "enquire_link",
    "enquire_link_resp",
    "unbind",
    "unbind_resp",
    "deliver_sm_resp",
    "generic_nack",
    "other_request",
    "other_response",
    "invalid",
];

/// Index of the `invalid` label: frames that did not decode.
pub(super) const INVALID: usize = 12;

pub(super) fn command_index(id: CommandId) -> usize {
    match id {
        CommandId::BindTransmitter => 0,
        CommandId::BindReceiver => 1,
        CommandId::BindTransceiver => 2,
        CommandId::SubmitSm => 3,
        CommandId::EnquireLink => 4,
        CommandId::EnquireLinkResp => 5,
        CommandId::Unbind => 6,
        CommandId::UnbindResp => 7,
        CommandId::DeliverSmResp => 8,
        CommandId::GenericNack => 9,
        other if other.is_response() => 11,
        _ => 10,
    }
}

/// Received PDUs of one read, by command.
#[derive(Default)]
pub(super) struct PduTally {
    counts: [u64; COMMANDS.len()],
}

impl PduTally {
    pub(super) fn count(&mut self, index: usize) {
        if let Some(count) = self.counts.get_mut(index) {
            *count += 1;
        }
    }

    pub(super) fn flush(&mut self) {
        for (count, command) in self.counts.iter_mut().zip(COMMANDS) {
            if *count > 0 {
                metrics::counter!(PDUS, "command" => command).increment(*count);
                *count = 0;
            }
        }
    }
}

/// One error status answered `n` times.
pub(super) fn error(status: CommandStatus, n: u64) {
    if n > 0 && status != CommandStatus::EsmeRok {
        metrics::counter!(ERRORS, "status" => status_name(status)).increment(n);
    }
}

pub(super) fn bind_refused(status: CommandStatus) {
    metrics::counter!(BINDS_REFUSED, "status" => status_name(status)).increment(1);
}

/// The SMPP name of a status, for labels and logs (SMPP 5.0 names for the TLV statuses
/// 0xC0..=0xC4, as rusmpp spells them: ESME_RINVTLVVAL is 3.4's ESME_RINVOPTPARAMVAL); statuses outside SMPP 3.4/5.0's tables
/// share one label so that a peer cannot inflate the label set.
pub(super) fn status_name(status: CommandStatus) -> &'static str {
    use CommandStatus as S;
    match status {
        S::EsmeRok => "ESME_ROK",
        S::EsmeRinvmsglen => "ESME_RINVMSGLEN",
        S::EsmeRinvcmdlen => "ESME_RINVCMDLEN",
        S::EsmeRinvcmdid => "ESME_RINVCMDID",
        S::EsmeRinvbndsts => "ESME_RINVBNDSTS",
        S::EsmeRalybnd => "ESME_RALYBND",
        S::EsmeRinvprtflg => "ESME_RINVPRTFLG",
        S::EsmeRinvregdlvflg => "ESME_RINVREGDLVFLG",
        S::EsmeRsyserr => "ESME_RSYSERR",
        S::EsmeRinvsrcadr => "ESME_RINVSRCADR",
        S::EsmeRinvdstadr => "ESME_RINVDSTADR",
        S::EsmeRinvmsgid => "ESME_RINVMSGID",
        S::EsmeRbindfail => "ESME_RBINDFAIL",
        S::EsmeRinvpaswd => "ESME_RINVPASWD",
        S::EsmeRinvsysid => "ESME_RINVSYSID",
        S::EsmeRcancelfail => "ESME_RCANCELFAIL",
        S::EsmeRreplacefail => "ESME_RREPLACEFAIL",
        S::EsmeRmsgqful => "ESME_RMSGQFUL",
        S::EsmeRinvsertyp => "ESME_RINVSERTYP",
        S::EsmeRinvnumdests => "ESME_RINVNUMDESTS",
        S::EsmeRinvdlname => "ESME_RINVDLNAME",
        S::EsmeRinvdestflag => "ESME_RINVDESTFLAG",
        S::EsmeRinvsubrep => "ESME_RINVSUBREP",
        S::EsmeRinvesmclass => "ESME_RINVESMCLASS",
        S::EsmeRcntsubdl => "ESME_RCNTSUBDL",
        S::EsmeRsubmitfail => "ESME_RSUBMITFAIL",
        S::EsmeRinvsrcton => "ESME_RINVSRCTON",
        S::EsmeRinvsrcnpi => "ESME_RINVSRCNPI",
        S::EsmeRinvdstton => "ESME_RINVDSTTON",
        S::EsmeRinvdstnpi => "ESME_RINVDSTNPI",
        S::EsmeRinvsystyp => "ESME_RINVSYSTYP",
        S::EsmeRinvrepflag => "ESME_RINVREPFLAG",
        S::EsmeRinvnummsgs => "ESME_RINVNUMMSGS",
        S::EsmeRthrottled => "ESME_RTHROTTLED",
        S::EsmeRinvsched => "ESME_RINVSCHED",
        S::EsmeRinvexpiry => "ESME_RINVEXPIRY",
        S::EsmeRinvdftmsgid => "ESME_RINVDFTMSGID",
        S::EsmeRxTAppn => "ESME_RX_T_APPN",
        S::EsmeRxPAppn => "ESME_RX_P_APPN",
        S::EsmeRxRAppn => "ESME_RX_R_APPN",
        S::EsmeRqueryfail => "ESME_RQUERYFAIL",
        S::EsmeRinvtlvstream => "ESME_RINVTLVSTREAM",
        S::EsmeRtlvnotallwd => "ESME_RTLVNOTALLWD",
        S::EsmeRinvtlvlen => "ESME_RINVTLVLEN",
        S::EsmeRmissingtlv => "ESME_RMISSINGTLV",
        S::EsmeRinvtlvval => "ESME_RINVTLVVAL",
        S::EsmeRdeliveryfailure => "ESME_RDELIVERYFAILURE",
        S::EsmeRunknownerr => "ESME_RUNKNOWNERR",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(status_name(CommandStatus::EsmeRthrottled), "ESME_RTHROTTLED");
        assert_eq!(status_name(CommandStatus::from(0x0000_0400)), "OTHER");
        assert_eq!(COMMANDS[command_index(CommandId::SubmitSm)], "submit_sm");
        assert_eq!(COMMANDS[command_index(CommandId::QuerySm)], "other_request");
        assert_eq!(COMMANDS[command_index(CommandId::SubmitSmResp)], "other_response");
        assert_eq!(COMMANDS[INVALID], "invalid");
    }
}
