// TypeScript declarations of the WASM client's JavaScript API (web/build.sh copies this file
// into web/pkg/ as quire_client.d.ts). Indices count UTF-16 code units, like JavaScript strings.

/** Loads the WebAssembly module; call once before anything else. */
export default function init(
  options?: { module_or_path?: string | URL | Request | Response | BufferSource | WebAssembly.Module }
): Promise<unknown>;

export type Status = 'connecting' | 'connected' | 'offline' | 'closed';

export interface ClientOptions {
  /** Access token (sent as `?token=`). */
  token?: string;
  /**
   * Called before every connection attempt (the first included) for the token to connect
   * with; may return the token or a promise of it. Tokens expire: the server closes a socket
   * at its token's `exp` with 4401, and the client reconnects with a fresh token from here,
   * resyncing without losing an edit. A rejected promise counts as a failed attempt (retried
   * with backoff).
   */
  tokenProvider?: () => string | Promise<string>;
  /** First reconnect delay in ms (default 200; the actual delay is jittered to 50-100 %). */
  minBackoffMs?: number;
  /** Longest reconnect delay in ms (default 5000). */
  maxBackoffMs?: number;
}

export interface AwarenessChange {
  added: number[];
  updated: number[];
  removed: number[];
}

export class QuireClient {
  /** Connects at once to `${serverUrl}/${encodeURIComponent(document)}`. */
  constructor(serverUrl: string, document: string, options?: ClientOptions);
  /** This client's Yjs client id (its key in awareness). */
  readonly clientId: number;
  readonly status: Status;
  /** The document holds the server's state (since the last (re)connect). */
  readonly synced: boolean;
  /** Local changes the server has not yet confirmed as committed (durable acknowledgement). */
  readonly unsaved: number;

  getText(name: string): QuireText;
  getMap(name: string): QuireMap;
  getArray(name: string): QuireArray;

  /** Sets this client's awareness state (any JSON-serialisable object); null clears it. */
  setLocalState(state: object | null): void;
  setLocalStateField(field: string, value: unknown): void;
  getLocalState(): object | null;
  /** Every present client's state, this one's included, keyed by client id. */
  getStates(): Map<number, any>;

  on(event: 'status', cb: (status: Status) => void): void;
  on(event: 'synced', cb: (synced: boolean) => void): void;
  /** Fires whenever `unsaved` changes; 0 means every local change is committed. */
  on(event: 'saved', cb: (unsaved: number) => void): void;
  on(event: 'awareness', cb: (change: AwarenessChange, origin: 'local' | 'remote') => void): void;
  /** The server closed with a permanent code (4400-4499 except 4401, token expired), or refused
   *  the upgrade (401, 403, 404); the client does not reconnect. */
  on(event: 'closed', cb: (info: { code: number; reason: string }) => void): void;
  /** The server refused a change (read-only access); refused changes stay unsaved. */
  on(event: 'denied', cb: (reason: string) => void): void;
  off(event: string, cb: Function): void;

  /** Resolves once synced; rejects if the client closes first. */
  whenSynced(): Promise<void>;
  /** Resolves once every local change is committed; rejects if the client closes with
   * changes unsaved. */
  whenSaved(): Promise<void>;
  /** Goes offline on purpose; edits keep working locally and are sent by `connect()`. */
  disconnect(): void;
  /** Back online; also restarts a client stopped by a permanent close (e.g. after setToken). */
  connect(): void;
  /** The whole document as a Yjs v1 update (keep unsaved work across reloads). */
  encodeStateAsUpdate(): Uint8Array;
  /** Applies a Yjs v1 update as a local change: what the server lacks is sent, and counts as
   * unsaved until committed. */
  applyUpdate(update: Uint8Array): void;
  /** The token used from the next connection on. */
  setToken(token: string | null): void;
  /** Sends pending changes, clears the awareness state, closes the connection and stops
   * for good. */
  destroy(): void;
  free(): void;
}

export type TextDelta = { insert: string } | { delete: number } | { retain: number };

/**
 * A position that moves with the text, shaped like a Yjs `RelativePosition` object (every key
 * present, `null` where unset): what y-codemirror.next puts in awareness for cursors.
 * `resolveStickyIndex` also reads Yjs' `relativePositionToJSON` form (keys left out).
 */
export type StickyIndex = {
  type: { client: number; clock: number } | null;
  tname: string | null;
  item: { client: number; clock: number } | null;
  assoc: number;
};

export class QuireText {
  insert(index: number, text: string): void;
  delete(index: number, length: number): void;
  toString(): string;
  readonly length: number;
  /** Called after every transaction that changed the text; `local` is false for remote changes. */
  observe(cb: (delta: TextDelta[], local: boolean) => void): number;
  unobserve(id: number): void;
  /** A position that moves with the text; assoc < 0 sticks to the character before. */
  stickyIndex(index: number, assoc: number): StickyIndex;
  resolveStickyIndex(pos: StickyIndex): number | undefined;
  free(): void;
}

export class QuireMap {
  set(key: string, value: unknown): void;
  get(key: string): any;
  delete(key: string): void;
  has(key: string): boolean;
  keys(): string[];
  toJSON(): Record<string, any>;
  readonly size: number;
  observe(cb: (changes: { key: string; action: 'add' | 'update' | 'delete' }[], local: boolean) => void): number;
  unobserve(id: number): void;
  free(): void;
}

export class QuireArray {
  insert(index: number, values: unknown[]): void;
  push(values: unknown[]): void;
  delete(index: number, length: number): void;
  get(index: number): any;
  toJSON(): any[];
  readonly length: number;
  observe(cb: (delta: ({ insert: any[] } | { delete: number } | { retain: number })[], local: boolean) => void): number;
  unobserve(id: number): void;
  free(): void;
}
