//! An SMPP address between its two shapes: as the protocols crate reads and writes it,
//! and as the storage crate keeps it (neither crate depends on the other).

use sendium_protocols::smpp::SmppAddress;
use sendium_storage::Address;

/// A stored address, to put on the wire.
pub fn to_wire(a: &Address) -> SmppAddress {
    SmppAddress::new(a.ton, a.npi, a.addr.clone())
}

/// An address read from the wire, to store.
pub fn from_wire(a: SmppAddress) -> Address {
    Address::new(a.ton, a.npi, a.addr)
}
