/**
 * The parts of the HTTP API's description (wire.gen.ts, generated from
 * /openapi.json by `npm run client:types`) that the client sends and reads,
 * and the compiler's check that the client's own types agree with them.
 *
 * The client's exported types stay hand-written where that reads better (some
 * are the library's own types, and a method may read only part of an
 * answer); each place that sends a body or reads an answer
 * names its operation, so that a field the server renames, drops or retypes
 * fails the build instead of the client at run time.
 */
import type { paths } from './wire.gen.js';

type Method = 'get' | 'put' | 'post' | 'delete';
type Operation<P extends keyof paths, M extends Method> = paths[P][M];

/** The JSON an operation answers with status S (default 200). */
export type Answer<P extends keyof paths, M extends Method, S extends number = 200> =
  Operation<P, M> extends { responses: infer R }
    ? S extends keyof R
      ? R[S] extends { content: { 'application/json': infer J } }
        ? J
        : never
      : never
    : never;

/** The JSON body an operation takes. */
export type Body<P extends keyof paths, M extends Method> =
  NonNullable<Operation<P, M> extends { requestBody?: infer B } ? B : never> extends {
    content: { 'application/json': infer J };
  }
    ? J
    : never;

/** The keys a type names, without its index signatures. */
type NamedKeys<T> = keyof { [K in keyof T as string extends K ? never : number extends K ? never : K]: T[K] };
type RequiredKeys<T> = { [K in NamedKeys<T>]-?: object extends Pick<T, K> ? never : K }[NamedKeys<T>];
type Defined<T> = Exclude<T, undefined>;
/**
 * T without the index signatures of its objects (the document's
 * `additionalProperties: true`), at any depth: an interface has no implicit
 * index signature, so the client's NetworkInfo would not be assignable to
 * `{mode?, ...} & {[key: string]: unknown}`. An object the document does not
 * describe (`{[key: string]: unknown}`) is any object; a map of known values
 * (metadata's strings) is kept as it is.
 */
type Named<T> = T extends readonly (infer E)[]
  ? Named<E>[]
  : T extends object
    ? [NamedKeys<T>] extends [never]
      ? unknown extends T[keyof T]
        ? object
        : T
      : { [K in keyof T as string extends K ? never : number extends K ? never : K]: Named<T[K]> }
    : T;

/**
 * What is wrong with the client's type H as the document's W, field by field;
 * {} when nothing is. Wrong: a field both name whose type in H W does not
 * accept; a field H names as optional that W requires; a field of H that W does
 * not name, unless W takes more than it names (`additionalProperties: true`:
 * an open object such as a context). Fields W has and H does not name are
 * fine, required or not: the client need not read all of an answer.
 */
export type Disagreement<H, W> = {
  [
    K in NamedKeys<H> as K extends NamedKeys<W>
      ? [Defined<H[K]>] extends [Defined<Named<W[K]>>]
        ? never
        : K
      : string extends keyof W
        ? never
        : K
  ]: K extends NamedKeys<W> ? { client: H[K]; document: W[K] } : 'not in the document';
} & { [K in Extract<Exclude<RequiredKeys<W>, RequiredKeys<H>>, NamedKeys<H>>]: 'required by the document' };

/**
 * H, when it agrees with W (see Disagreement); otherwise a type nothing is
 * assignable to that names the fields in question, so the build fails where
 * the answer is read or the body is sent.
 */
export type Checked<H, W> = keyof Disagreement<H, W> extends never ? H : { drift: Disagreement<H, W> };
