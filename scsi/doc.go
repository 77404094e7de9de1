// Package scsi emulates a SCSI direct-access block device (a subset of SPC-4 and SBC-3) over a
// backend.Backend: each LUN is read-only or read-write, with 512- or 4096-byte logical blocks.
// It knows nothing of SRP or RDMA and does no logging: every outcome is a return value.
//
// # Commands
//
// TEST UNIT READY, REQUEST SENSE, INQUIRY (standard data; VPD pages 0x00, 0x80, 0x83 with a
// stable NAA 6 identifier, or a configured one, and with ALUA the relative target port and
// target port group, 0x86, 0xB0, 0xB1, 0xB2), REPORT LUNS, READ CAPACITY(10/16), READ and
// WRITE(6/10/12/16) with FUA, VERIFY(10/16) with BYTCHK 0/1/3, SYNCHRONIZE CACHE(10/16),
// MODE SENSE(6/10) and MODE SELECT(6/10) (read-write error recovery page, caching page with a
// changeable WCE, control page with a changeable D_SENSE, informational exceptions page),
// START STOP UNIT, UNMAP (when the backend can discard), WRITE SAME(10/16) with UNMAP and NDOB,
// COMPARE AND WRITE, GET LBA STATUS and LOG SENSE (supported pages, logical block
// provisioning), from the backend's backend.Allocation when it has one, REPORT SUPPORTED
// OPERATION CODES, REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS, REPORT TARGET PORT GROUPS (with
// ALUA), PERSISTENT RESERVE IN (READ KEYS, READ RESERVATION, REPORT
// CAPABILITIES, READ FULL STATUS) and OUT (REGISTER, REGISTER AND IGNORE EXISTING KEY, RESERVE,
// RELEASE, CLEAR, PREEMPT, PREEMPT AND ABORT; all six reservation types).
//
// Errors are CHECK CONDITION with fixed-format sense data (descriptor format once an initiator
// sets D_SENSE), RESERVATION CONFLICT, or TASK ABORTED for a command whose context ended
// before it could start. ILLEGAL REQUEST, INVALID FIELD IN CDB / PARAMETER LIST carry a field
// pointer; MEDIUM ERROR and MISCOMPARE carry the LBA or byte offset in INFORMATION.
//
// # Use from a target
//
// A target builds one LUNSet per set of LUNs it presents (LUN numbers to *LUN, created with
// NewLUN over a backend) and, for each SCSI command it receives:
//
//  1. fills a Command: CDB, LUN (the 8-byte SAM LUN), Nexus (initiator and target port
//     identifiers), Attr (the task attribute, numerically SRP's), DataIn (a buffer the data-in
//     may go straight into, e.g. registered memory), Sense (MaxSenseLen bytes, or a window
//     into the response IU) and WriteProtected (the nexus's ACL maps the LUN read-only);
//  2. calls LUNSet.Parse to learn the direction and length of the data transfer the CDB asks
//     for (Execute reuses this parse); a DATA PROTECT error (a write the nexus may not make)
//     it may answer at once; on any other error it fetches nothing and lets Execute report it;
//  3. calls LUNSet.Admit in arrival order — this is what makes ORDERED and HEAD OF QUEUE mean
//     something when commands then execute on many goroutines; it never blocks; for DirOut
//     it then fetches CDBInfo.Length bytes (RDMA READ) into Command.DataOut;
//  4. calls LUNSet.Execute (which waits for the command's turn, then runs it), or
//     LUNSet.Withdraw if it gives up on the command (connection lost, data transfer failed);
//  5. sends Result.DataInLen bytes of DataIn (RDMA WRITE), and a response with Result.Status
//     and, for CHECK CONDITION, the Result.SenseLen bytes of Command.Sense; residuals follow
//     from the expected length and DataInLen (or CDBInfo.Length for data-out).
//
// Task management maps to LUN.Reset (LOGICAL UNIT RESET, after the target has aborted the
// LUN's tasks by cancelling their contexts) and LUNSet.NexusLost (I_T nexus loss). Commands to
// LUN numbers not in the set are answered by the set as SPC requires.
//
// Execute does not allocate on the READ and WRITE paths; READ data goes from the backend
// straight into Command.DataIn.
//
// # Ordering, atomicity, durability
//
// SIMPLE commands run concurrently; an ORDERED command waits for every command admitted before
// it and holds back every command admitted after it; HEAD OF QUEUE runs at once (ACA is not
// supported). Medium writes hold a range lock on their LBAs, which makes COMPARE AND WRITE
// atomic against every other write to an overlapping range; writes to disjoint ranges never
// wait for each other. Data reaches the backend before status; with FUA, or with WCE=0, it is
// also flushed (Backend.Flush, shared between concurrent writers) before GOOD, and SYNCHRONIZE
// CACHE flushes everything acknowledged before it.
//
// # Unit attention
//
// Each I_T nexus gets POWER ON, RESET, OR BUS DEVICE RESET OCCURRED on its first command to a
// LUN (INQUIRY, REPORT LUNS and REQUEST SENSE excepted), BUS DEVICE RESET FUNCTION OCCURRED
// after LUN.Reset, I_T NEXUS LOSS OCCURRED after NexusLost, MODE PARAMETERS CHANGED when
// another nexus changed a mode page, REPORTED LUNS DATA HAS CHANGED when the set changed, and
// RESERVATIONS PREEMPTED / RELEASED or REGISTRATIONS PREEMPTED as persistent reservation
// changes affect it, and ASYMMETRIC ACCESS STATE CHANGED when LUN.SetALUAState changes the
// state of the target port group it comes through — each once.
//
// # ALUA
//
// With LUNConfig.ALUA a LUN has target port groups (its own gateway's and others') with
// implicit asymmetric access states. A command through a local port whose group is standby,
// unavailable or transitioning gets NOT READY (04/0B, 04/0C, 04/0A) unless SPC-4 allows it in
// that state (INQUIRY, REPORT LUNS, REQUEST SENSE, REPORT TARGET PORT GROUPS; in standby also
// MODE SENSE/SELECT, LOG SENSE, READ CAPACITY, PERSISTENT RESERVE IN/OUT and the REPORT
// SUPPORTED commands). The check comes after unit attention and before the CDB is judged (so
// LUNSet.Parse may accept a CDB that Execute then refuses with NOT READY).
package scsi
